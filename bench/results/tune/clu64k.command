bench/tune.sh 3 clu64k
CLIENTS='convert-to' bench/tune.sh 3 clu64k (those cells)
CLIENTS='convert-to' bench/tune.sh 3 clu64k (those cells)
