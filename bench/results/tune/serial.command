bench/tune.sh 3 serial
