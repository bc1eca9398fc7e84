bench/tune.sh 3 qcow2dec
