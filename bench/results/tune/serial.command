bench/tune.sh 3 serial
CLIENTS='nbdcopy4k convert-to' bench/tune.sh 3 serial (those cells)
