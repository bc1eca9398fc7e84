bench/tune.sh 3 lat1
CLIENTS='nbdcopy4k convert-to' bench/tune.sh 3 lat1 (those cells)
