#!/usr/bin/env python3
"""Copies the files under one folder of a PyPI wheel without downloading the wheel.

    ci/wheel_files.py PACKAGE VERSION PREFIX DEST

A wheel is a zip: its directory sits at the end, and each member can be read at its offset,
so HTTP range requests fetch only the directory and the members wanted (NCCL's wheels are
200 MB; their headers are 0.5 MB). The wheel is found on the package index pip uses
(`PIP_INDEX_URL`, else PyPI's simple index): the manylinux x86_64 file of VERSION. Members
under PREFIX (e.g. `nvidia/nccl/include/`) are written under DEST with PREFIX removed. Where
the server does not serve ranges, the whole wheel is downloaded with pip instead.
"""
import html.parser
import io
import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
import zipfile

TIMEOUT = 120


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def wheel_url(package, version):
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    page = f"{index}/{package}/"
    with urllib.request.urlopen(page, timeout=TIMEOUT) as r:
        text = r.read().decode("utf-8", "replace")
    p = Links()
    p.feed(text)
    norm = package.replace("-", "_")
    want = re.compile(rf"{re.escape(norm)}-{re.escape(version)}-.*manylinux.*x86_64\.whl$")
    for h in p.hrefs:
        url = urllib.parse.urljoin(page, h).split("#", 1)[0]
        if want.search(url.rsplit("/", 1)[-1]):
            return url
    raise SystemExit(f"wheel_files: no manylinux x86_64 wheel of {package} {version} at {page}")


class Ranged(io.RawIOBase):
    """A read-only file over HTTP range requests."""

    def __init__(self, url):
        self.url = url
        req = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            if r.headers.get("Accept-Ranges", "").lower() != "bytes":
                raise OSError("no range requests")
            self.size = int(r.headers["Content-Length"])
        self.pos = 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, off, whence=0):
        self.pos = [off, self.pos + off, self.size + off][whence]
        return self.pos

    def readinto(self, b):
        if self.pos >= self.size or len(b) == 0:
            return 0
        end = min(self.pos + len(b), self.size) - 1
        req = urllib.request.Request(self.url, headers={"Range": f"bytes={self.pos}-{end}"})
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            data = r.read()
        if r.status != 206:
            raise OSError(f"range request answered {r.status}")
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)


def extract(z, prefix, dest):
    n = 0
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        rel = info.filename[len(prefix):]
        if ".." in rel.split("/"):
            raise SystemExit(f"wheel_files: refusing member {info.filename}")
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out, "wb") as dst:
            dst.write(src.read())
        n += 1
    if n == 0:
        raise SystemExit(f"wheel_files: nothing under {prefix}")
    return n


def main():
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    package, version, prefix, dest = sys.argv[1:]
    try:
        url = wheel_url(package, version)
        with zipfile.ZipFile(io.BufferedReader(Ranged(url), buffer_size=1 << 18)) as z:
            n = extract(z, prefix, dest)
        how = "range requests"
    except (OSError, zipfile.BadZipFile) as e:
        print(f"wheel_files: {package} {version}: {e}; downloading the wheel", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--only-binary=:all:", "--dest", tmp, f"{package}=={version}"], check=True)
            whl = [f for f in os.listdir(tmp) if f.endswith(".whl")][0]
            with zipfile.ZipFile(os.path.join(tmp, whl)) as z:
                n = extract(z, prefix, dest)
        how = "the wheel"
    print(f"wheel_files: {n} files of {package} {version} under {prefix} into {dest} ({how})")


if __name__ == "__main__":
    main()
