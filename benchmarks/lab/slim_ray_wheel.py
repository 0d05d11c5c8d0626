#!/usr/bin/env python3
"""Repack a Ray wheel into a slim one that fits the device machine's 64 MiB carry limit.

What kinv's Ray executor needs is core Ray: ray.init, remote actors, ray.get/wait/kill.  The cp312 wheel is
79.3 MB; slimmed and stripped it is 32.8 MB.  Made so for benchmarks/lab/ray_campaign_session.sh:

    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d /tmp/ray312 ray==2.60.0
    python3 benchmarks/lab/slim_ray_wheel.py /tmp/ray312/ray-2.60.0-*.whl .whl/ --strip

(its dependencies travel beside it: click, filelock, jsonschema and its tree, msgpack, protobuf, pyyaml,
requests and its tree).

Usage: slim.py IN.whl OUT_DIR_OR_FILE [--strip] [--keep PREFIX ...] [--drop PREFIX ...]

* Drops Java jars, dashboard JS build, *.js.map and the ray libraries
  (rllib, data, serve, tune, train, llm, air) which ray core does not import.
* --strip: run `strip --strip-unneeded` on ELF files (removes the static
  symbol table only; dynamic symbols stay, so loading/linking is unchanged,
  only C++ crash backtraces lose function names).
* Keeps each entry's ZipInfo metadata (date_time, external_attr -> unix
  permissions, so gcs_server/raylet stay executable).
* Rewrites <dist>.dist-info/RECORD to list exactly the kept files with
  sha256 + size.
The output file keeps the input file name, so pip accepts it.
"""
import argparse
import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile

DROP_PREFIXES = [
    "ray/jars/",
    "ray/dashboard/client/build/",
    "ray/rllib/",
    "ray/data/",
    "ray/serve/",
    "ray/tune/",
    "ray/train/",
    "ray/llm/",
    "ray/air/",
]
DROP_SUFFIXES = [".js.map"]


def record_hash(data: bytes) -> str:
    d = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(d).rstrip(b"=").decode()


def strip_elf(data: bytes) -> bytes:
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(data)
        p = f.name
    try:
        subprocess.run(["strip", "--strip-unneeded", p], check=True)
        with open(p, "rb") as f:
            out = f.read()
        return out if len(out) < len(data) else data
    finally:
        os.unlink(p)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out", help="output directory or file path")
    ap.add_argument("--strip", action="store_true")
    ap.add_argument("--keep", action="append", default=[],
                    help="prefix to keep even if a drop rule matches")
    ap.add_argument("--drop", action="append", default=[],
                    help="extra prefix to drop")
    a = ap.parse_args()

    out = a.out
    if os.path.isdir(out):
        out = os.path.join(out, os.path.basename(a.inp))
    if os.path.abspath(out) == os.path.abspath(a.inp):
        sys.exit("refusing to overwrite input")

    drops = DROP_PREFIXES + a.drop

    def dropped(name):
        if any(name.startswith(k) for k in a.keep):
            return False
        return any(name.startswith(p) for p in drops) or any(
            name.endswith(s) for s in DROP_SUFFIXES)

    zin = zipfile.ZipFile(a.inp)
    infos = zin.infolist()
    records = [i for i in infos if i.filename.count("/") == 1
               and i.filename.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        sys.exit(f"expected one top-level RECORD, got {[r.filename for r in records]}")
    record_name = records[0].filename

    tmp = out + ".tmp"
    n_keep = n_drop = bytes_drop = 0
    lines = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for info in infos:
            name = info.filename
            if name == record_name:
                continue
            if info.is_dir():
                continue
            if dropped(name):
                n_drop += 1
                bytes_drop += info.compress_size
                continue
            data = zin.read(info)
            if a.strip and data[:4] == b"\x7fELF":
                data = strip_elf(data)
            zi = zipfile.ZipInfo(name, date_time=info.date_time)
            zi.external_attr = info.external_attr
            zi.create_system = info.create_system
            zi.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(zi, data, compresslevel=9)
            lines.append(f"{name},{record_hash(data)},{len(data)}")
            n_keep += 1
        lines.append(f"{record_name},,")
        rinfo = records[0]
        zi = zipfile.ZipInfo(record_name, date_time=rinfo.date_time)
        zi.external_attr = rinfo.external_attr
        zi.create_system = rinfo.create_system
        zi.compress_type = zipfile.ZIP_DEFLATED
        zout.writestr(zi, "\n".join(lines) + "\n", compresslevel=9)
    os.replace(tmp, out)
    print(f"kept {n_keep} files, dropped {n_drop} "
          f"({bytes_drop / 1e6:.1f} MB compressed); "
          f"{os.path.basename(a.inp)}: {os.path.getsize(a.inp)/1e6:.1f} MB -> "
          f"{out}: {os.path.getsize(out)/1e6:.1f} MB")


if __name__ == "__main__":
    main()
