bench/tune.sh 3 lat1
