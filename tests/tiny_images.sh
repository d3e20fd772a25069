# Sourced by the MLP tests: tiny_images DIR writes a small IDX image set
# into DIR (not gzipped, whatever the names say: the loader reads both):
# 512 training and 128 test images of 8 x 8 pixels from the GPL's text, and
# labels 0..9 from its bytes.
tiny_images() {
    local out=$1 bytes
    bytes=$(mktemp)
    mkdir -p "$out"
    idx() { # file dims count < bytes
        local f=$1 nd=$2 n=$3
        { printf "\x00\x00\x08\x0$nd"; printf "\x00\x00\x$(printf %02x $((n >> 8)))\x$(printf %02x $((n & 255)))"
          [ "$nd" = 3 ] && printf "\x00\x00\x00\x08\x00\x00\x00\x08"; cat; } > "$out/$f"
    }
    labels() { for b in $(tail -c "$1" "$bytes" | od -An -v -tu1); do printf "\x0$((b % 10))"; done; }
    tail -c 70000 /usr/share/common-licenses/GPL-3 > "$bytes"
    head -c 32768 "$bytes" | idx train-images-idx3-ubyte.gz 3 512
    head -c 8192 "$bytes" | idx t10k-images-idx3-ubyte.gz 3 128
    labels 512 | idx train-labels-idx1-ubyte.gz 1 512
    labels 128 | idx t10k-labels-idx1-ubyte.gz 1 128
    rm -f "$bytes"
}
