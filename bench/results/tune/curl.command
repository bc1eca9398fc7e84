bench/tune.sh 3 curl
