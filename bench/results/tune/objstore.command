bench/tune.sh 3 objstore
