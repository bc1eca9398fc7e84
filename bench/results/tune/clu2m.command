bench/tune.sh 3 clu2m
CLIENTS='convert-to' bench/tune.sh 3 clu2m (those cells)
CLIENTS='convert-to' bench/tune.sh 3 clu2m (those cells)
