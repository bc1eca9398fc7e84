bench/tune.sh 3 zero
