bench/tune.sh 3 clu64k
