bench/tune.sh 3 cdi
