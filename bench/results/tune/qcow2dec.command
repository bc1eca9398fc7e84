bench/tune.sh 3 qcow2dec
CLIENTS='nbdcopy nbdcopy2m' bench/tune.sh 3 qcow2dec (those cells)
