bench/tune.sh 5 zero
