bench/tune.sh 3 lat1
CLIENTS='convert-to' bench/tune.sh 3 lat1 (those cells)
CLIENTS='convert-to' bench/tune.sh 3 lat1 (those cells)
