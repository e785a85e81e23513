#!/usr/bin/env bash
# Fetches the documents the read_document tests read, once per machine, and prints the folder
# that holds them (${BATCHINFER_DOCUMENTS:-~/.cache/batchinfer-documents}):
#
#   pdf/*.pdf        the PDF manuals of four Debian packages, typeset by others with groff,
#                    pdfTeX, Texinfo and LaTeX (bash-doc, gnuplot-doc, asymptote-doc, xfig-doc
#                    of Debian 12, each .deb pinned by sha256)
#   html/*.html      web pages of the same packages' HTML manuals (man2html, LaTeX2HTML,
#                    hand-written)
#   docx/*.docx      the Word documents python-docx tests itself with (its sdist, 1.2.0)
#   made/scanned.pdf a page that is an image alone (a photo saved as PDF by Pillow)
#   made/locked.pdf  bash.pdf encrypted with a password (by pypdf)
#   python/bin/python  Python with pypdfium2 (the same pdfium read_document loads),
#                    python-docx, lxml and tokenizers: the tests' references
#
# The folder appears by one rename, complete. Nothing is kept in git.
set -euo pipefail

dest="${BATCHINFER_DOCUMENTS:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer-documents}"
mkdir -p "$(dirname "$dest")"
exec 9>"$dest.lock"
flock 9

DEBIAN=http://deb.debian.org/debian/pool/main
DEBS="b/bash/bash-doc_5.2.15-2_all.deb 2c1a353f7004d14ba81db19c253b958d2dd9582027650739c530fd50376a9d8b
g/gnuplot/gnuplot-doc_5.4.4+dfsg1-2_all.deb 73fe1816a296594cf6a1d38528f8d740fd650f57a2cb62e029f7920fcd5b31f0
a/asymptote/asymptote-doc_2.85+ds-1_all.deb b2ae6e97c64ede66c1e41cc913f790b01188d198557203a2b3c500ba3495e6ca
x/xfig/xfig-doc_3.2.8b-2_all.deb 36b17319b7c3fd7c670bd24dbce393e0776e1a4347a9467166194c8baec5644f"
DOCX_SDIST=https://files.pythonhosted.org/packages/a9/f7/eddfe33871520adab45aaa1a71f0402a2252050c14c7e3009446c8f4701c/python_docx-1.2.0.tar.gz
DOCX_SHA=7bc9d7b7d8a69c9c02ca09216118c86552704edc23bac179283f2e38f86220ce
PYTHON_PACKAGES="pypdfium2==5.15.2 python-docx==1.2.0 lxml==6.0.2 pypdf==6.1.3 pillow==12.0.0
    tokenizers==0.23.2"
made_of="$DEBS $DOCX_SHA $PYTHON_PACKAGES html-2"

if [ "$(cat "$dest/ready" 2>/dev/null)" != "$made_of" ]; then
    rm -rf "$dest"
    work=$(mktemp -d "$dest.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/debs" "$work/pdf" "$work/html" "$work/docx" "$work/made"
    while read -r path sha; do
        deb="$work/debs/$(basename "$path")"
        curl -fsSL --retry 3 -o "$deb" "$DEBIAN/$path"
        echo "$sha  $deb" | sha256sum -c --quiet - ||
            { echo "$path does not match its pinned sha256" >&2; exit 1; }
        dpkg-deb -x "$deb" "$work/debs/root"
    done <<< "$DEBS"
    find "$work/debs/root/usr/share/doc" -name '*.pdf' -type f -size +1k -exec cp {} "$work/pdf/" \;
    (cd "$work/debs/root/usr/share/doc" &&
        for page in bash/bash.html asymptote/faq/*.html gnuplot/htmldocs/node1*.html \
            xfig/html/*.html; do
            [ -f "$page" ] && [ ! -L "$page" ] && cp "$page" "$work/html/$(echo "$page" | tr / -)"
        done)
    curl -fsSL --retry 3 -o "$work/debs/docx.tar.gz" "$DOCX_SDIST"
    echo "$DOCX_SHA  $work/debs/docx.tar.gz" | sha256sum -c --quiet - ||
        { echo "python-docx's sdist does not match its pinned sha256" >&2; exit 1; }
    tar -xzf "$work/debs/docx.tar.gz" -C "$work/debs" --wildcards '*.docx'
    find "$work/debs/python_docx-1.2.0" -name '*.docx' -path '*test_files*' -exec cp {} "$work/docx/" \;
    python3 -m venv "$work/python"
    "$work/python/bin/python" -m pip install --quiet --disable-pip-version-check \
        $PYTHON_PACKAGES >&2
    "$work/python/bin/python" - "$work" <<'PY'
import sys
from PIL import Image
from pypdf import PdfReader, PdfWriter
work = sys.argv[1]
Image.new("RGB", (400, 300), (200, 120, 40)).save(f"{work}/made/scanned.pdf")
writer = PdfWriter(clone_from=PdfReader(f"{work}/pdf/bash.pdf"))
writer.encrypt("secret", algorithm="RC4-128")
writer.write(f"{work}/made/locked.pdf")
PY
    rm -rf "$work/debs"
    printf '%s' "$made_of" > "$work/ready"
    mv -T "$work" "$dest"
    trap - EXIT
fi

echo "$dest"
