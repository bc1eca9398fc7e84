bench/tune.sh 3 objstore
CLIENTS='nbdcopy4k convert-to' bench/tune.sh 3 objstore (those cells)
