bench/tune.sh 3 objstore
CLIENTS='convert-to' bench/tune.sh 3 objstore (those cells)
CLIENTS='convert-to' bench/tune.sh 3 objstore (those cells)
