bench/tune.sh 3 qemu-nbd
