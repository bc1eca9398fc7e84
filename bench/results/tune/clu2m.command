bench/tune.sh 3 clu2m
