#!/usr/bin/env bash
# Make Fashion-MNIST available to ltbench, in this order of preference:
#   1. already there (Debian's /usr/share/datasets/fashion-mnist, ./data/fashion-mnist, $LTBENCH_DATA/fashion-mnist);
#   2. Debian's package dataset-fashion-mnist, when apt-get and root are available;
#   3. torchvision's downloader into ./data/fashion-mnist, when online;
#   4. otherwise a message saying where to put the files.
set -euo pipefail
PYTHON=${PYTHON:-python3}
DEBIAN_DIR=/usr/share/datasets/fashion-mnist
FILES=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)

has_all() {
  local dir=$1 f
  for f in "${FILES[@]}"; do
    [[ -e "$dir/$f" || -e "$dir/$f.gz" || -e "$dir/FashionMNIST/raw/$f" || -e "$dir/FashionMNIST/raw/$f.gz" ]] || return 1
  done
}

for dir in "$DEBIAN_DIR" data/fashion-mnist ${LTBENCH_DATA:+"$LTBENCH_DATA/fashion-mnist"}; do
  if has_all "$dir"; then echo "Fashion-MNIST: found in $dir"; exit 0; fi
done

if command -v apt-get >/dev/null && [[ $(id -u) -eq 0 ]]; then
  echo "Fashion-MNIST: installing Debian's dataset-fashion-mnist"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist >/dev/null; then
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist >/dev/null || true
  fi
  if has_all "$DEBIAN_DIR"; then echo "Fashion-MNIST: installed in $DEBIAN_DIR"; exit 0; fi
fi

echo "Fashion-MNIST: trying torchvision's download into data/fashion-mnist"
if "$PYTHON" -m ltbench.data.fashion_mnist --download data/fashion-mnist; then exit 0; fi

echo "Fashion-MNIST is missing and could not be installed or downloaded. Put the four files" >&2
echo "  ${FILES[*]} (optionally .gz)" >&2
echo "in data/fashion-mnist/ (or set LTBENCH_DATA), e.g. with 'apt-get install dataset-fashion-mnist' as root." >&2
exit 1
