bench/tune.sh 3 zero
CLIENTS='convert-to' bench/tune.sh 3 zero (those cells)
CLIENTS='convert-to' bench/tune.sh 3 zero (those cells)
