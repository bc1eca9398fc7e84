#!/usr/bin/env bash
# The seed's scenario: nbdkit's qcow2dec filter (nbdkit 1.36 and
# later) serving a compressed qcow2 with 2M clusters, copied by nbdcopy
# with its default 256K requests.  Without the filter each 256K read
# decodes the whole 2M cluster around it; through it, on the first
# run, the export learns a 2M grain (or one that holds whole clusters)
# and each cluster is fetched about once.  Reads reaching qcow2dec are
# counted by the log filter; the copy is checked against qemu-img's
# own reading of the image.  No timing is asserted.
source "$srcdir/functions.sh"
requires nbdcopy --version
requires qemu-img --version
have_filter qcow2dec || {
  echo "$0: skipped: no qcow2dec filter in nbdkit $(nbdkit --version)"
  exit 77
}

# 64M of compressible data (nbdkit's pattern plugin), compressed into
# 2M clusters.
nbdkit -U - pattern 64M --run "nbdcopy \"\$uri\" $tmp/raw.img"
qemu-img convert -q -c -f raw -O qcow2 -o cluster_size=2M \
  "$tmp/raw.img" "$tmp/disk.qcow2"
qemu-img info "$tmp/disk.qcow2" | grep -E 'cluster_size|disk size'

# copy [FILTER PARAMETER]: nbdcopy the export through qcow2dec to
# $tmp/out; prints the reads qcow2dec got.
copy ()
{
  rm -f "$tmp/log" "$tmp/out" "$tmp/stats"
  nbdkit -U - ${1:+"$1"} --filter=log --filter=qcow2dec \
    file "$tmp/disk.qcow2" logfile="$tmp/log" ${2:+"$2"} \
    --run "nbdcopy \"\$uri\" $tmp/out"
  cmp "$tmp/raw.img" "$tmp/out" || fail "$*: the copy differs"
  grep -c ' Read id=' "$tmp/log"
}
without=$(copy)
# The learning is timed: up to 3 tries (functions.sh).
copy_through_filter ()
{
  local with
  with=$(copy --filter="$FILTER" reshape-stats="$tmp/stats") ||
    fail "the copy through the filter failed"
  grep -A1 '^reshape-size=auto' "$tmp/stats"
  echo "qcow2dec reads: $with through the filter, $without without it"
  # 32 clusters: 256 reads of 256K without the filter.  Through it,
  # the learning's own (16 before it samples, then its pairs) and
  # about one per cluster.
  test "$with" -le 100 ||
    miss "the clusters were not fetched whole ($with reads," \
         "$without without)" || return
  grep -Eq 'cost flat up to (2048|4096|8192)K' "$tmp/stats" ||
    miss "no grain of whole clusters learnt"
}
tries copy_through_filter
