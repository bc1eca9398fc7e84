#!/usr/bin/env bash
# The seed's scenario: nbdkit's qcow2dec filter (nbdkit 1.36 and
# later) serving a compressed qcow2 with 2M clusters, copied by nbdcopy
# with its default 256K requests.  Without the filter each 256K read
# decodes the whole 2M cluster around it.  Through it, on the first
# run, nbdcopy is told 2M and reads whole clusters; and a client that
# keeps 256K reads (told so by nbdkit's blocksize-policy above the
# filter) gets a 2M grain (or one that holds whole clusters) learnt:
# either way each cluster is fetched about once.  Reads reaching qcow2dec are
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

# copy [FILTER PARAMETER [FILTER-ABOVE PARAMETER]]: nbdcopy the export
# through qcow2dec to $tmp/out; prints the reads qcow2dec got.
copy ()
{
  rm -f "$tmp/log" "$tmp/out" "$tmp/stats"
  nbdkit -U - ${3:+"$3"} ${1:+"$1"} --filter=log --filter=qcow2dec \
    file "$tmp/disk.qcow2" logfile="$tmp/log" ${2:+"$2"} ${4:+"$4"} \
    --run "nbdcopy \"\$uri\" $tmp/out"
  cmp "$tmp/raw.img" "$tmp/out" || fail "$*: the copy differs"
  grep -c ' Read id=' "$tmp/log"
}
without=$(copy)
copy_through_filter ()
{
  local with
  with=$(copy --filter="$FILTER" reshape-stats="$tmp/stats") ||
    fail "the copy through the filter failed"
  echo "qcow2dec reads: $with through the filter, $without without it"
  # 32 clusters: 256 reads of 256K without the filter; through it, 2M
  # reads, one per cluster.
  test "$with" -le 40 ||
    fail "the clusters were not fetched whole ($with reads, $without without)"
}
copy_through_filter

# The learning is timed: up to 3 tries (functions.sh).
learn_grain ()
{
  local with
  with=$(copy --filter="$FILTER" reshape-stats="$tmp/stats" \
           --filter=blocksize-policy blocksize-preferred=256K) ||
    fail "the copy through the filter failed"
  grep -A1 '^reshape-size=auto' "$tmp/stats"
  echo "told 256K: qcow2dec reads: $with through the filter, $without without it"
  # The stream's first reads (sent as they are until one is timed)
  # and about one per cluster.
  test "$with" -le 100 ||
    miss "the clusters were not fetched whole ($with reads," \
         "$without without)" || return
  grep -q 'grains of 2048K' "$tmp/stats" ||
    miss "no grain of whole clusters learnt"
}
if have_filter blocksize-policy; then
  tries learn_grain
else
  without "256K reads" "no blocksize-policy filter"
fi
