"""The references read_document is held to, and the comparison of its rows with them.

    python reference.py ROWS.json FOLDER

ROWS.json holds read_document's rows (newline-delimited JSON: filename, page, pages, text,
has_text, error) over FOLDER's pdf/, docx/ and html/ files. Printed, as JSON: for each kind, how
many pages (or files) match the reference exactly after whitespace is normalized, and the largest
character edit distance, as a share of the reference's length, of those that do not.

- PDF: pypdfium2 5.15.2's PdfTextPage.get_text_range() of each page (pdfium's own text).
- DOCX: python-docx 1.2.0: the body's paragraphs in order, with the paragraphs of each table
  cell (each cell once, row by row), joined by line ends.
- HTML: lxml's HTML parser: the text of <body> without head, script, style, noscript, noframes,
  template, nav, header, footer, aside, svg, iframe, object, form, button, select, textarea,
  canvas and math (and title, which a browser does not show), its blocks apart from the text
  around them, compared word by word.
"""

import difflib
import json
import os
import sys

import docx
import lxml.html
import pypdfium2 as pdfium
from docx.table import Table, _Cell
from docx.text.paragraph import Paragraph

LEFT_OUT = ["head", "title", "script", "style", "noscript", "noframes", "template", "nav",
            "header", "footer", "aside", "svg", "iframe", "object", "form", "button", "select",
            "textarea", "canvas", "math"]
# Elements a browser shows apart from the text around them.
BLOCKS = ["p", "div", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "main",
          "blockquote", "pre", "ul", "ol", "dl", "table", "figure", "hr", "address", "body",
          "details", "summary", "fieldset", "caption", "thead", "tbody", "tfoot", "br", "li",
          "tr", "dt", "dd", "figcaption", "option", "td", "th"]


def normalized(text):
    return " ".join(text.split())


def distance(a, b):
    """Levenshtein distance, two rows at a time, of what lies between the common start and end."""
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    end = 0
    while end < min(len(a), len(b)) - start and a[-1 - end] == b[-1 - end]:
        end += 1
    a, b = a[start:len(a) - end], b[start:len(b) - end]
    if len(a) * len(b) > 4_000_000:
        # Too long to compare cell by cell: what difflib finds unmatched, at least the distance.
        matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
        return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
                   if tag != "equal")
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def pdf_pages(path):
    document = pdfium.PdfDocument(path)
    try:
        return [document[i].get_textpage().get_text_range() for i in range(len(document))]
    finally:
        document.close()


def docx_text(path):
    document = docx.Document(path)
    lines = []

    def inner(container):
        for item in container.iter_inner_content():
            if isinstance(item, Paragraph):
                lines.append(item.text)
            elif isinstance(item, Table):
                for tr in item._tbl.tr_lst:
                    for tc in tr.tc_lst:
                        inner(_Cell(tc, item))

    inner(document)
    return "\n".join(lines)


def html_text(path):
    with open(path, "rb") as f:
        root = lxml.html.fromstring(f.read())
    for name in LEFT_OUT:
        for element in list(root.iter(name)):
            if element.getparent() is not None:
                element.drop_tree()
    for element in root.iter(*BLOCKS):
        element.text = "\n" + (element.text or "")
        element.tail = "\n" + (element.tail or "")
    bodies = root.xpath("//body")
    return (bodies[0] if bodies else root).text_content()


def main():
    rows_path, folder = sys.argv[1], sys.argv[2]
    got = {}
    with open(rows_path) as f:
        for line in f:
            row = json.loads(line)
            got.setdefault(row["filename"], []).append(row)
    report = {}
    for kind, read in [("pdf", pdf_pages), ("docx", docx_text), ("html", html_text)]:
        compared = equal = 0
        worst = 0.0
        missing = []
        unequal = []
        for name in sorted(os.listdir(os.path.join(folder, kind))):
            path = os.path.join(folder, kind, name)
            rows = sorted(got.get(path, []), key=lambda r: r["page"] or 0)
            want = read(path)
            if isinstance(want, str):
                want = [want]
            if len(rows) != len(want) or any(r.get("error") for r in rows):
                missing.append({"file": name, "rows": len(rows), "pages": len(want),
                                "errors": [r.get("error") for r in rows if r.get("error")]})
                continue
            for row, text in zip(rows, want):
                compared += 1
                if kind == "html":
                    a, b = row["text"].split(), text.split()
                else:
                    a, b = normalized(row["text"]), normalized(text)
                if a == b:
                    equal += 1
                else:
                    share = distance(a, b) / max(len(b), 1)
                    worst = max(worst, share)
                    at = next(i for i in range(min(len(a), len(b)) + 1)
                              if i == min(len(a), len(b)) or a[i] != b[i])
                    unequal.append({"file": name, "page": row["page"], "distance": share,
                                    "got": " ".join(map(str, a[at:at + 12])),
                                    "want": " ".join(map(str, b[at:at + 12]))})
        report[kind] = {"compared": compared, "equal": equal, "worst": worst,
                        "missing": missing, "unequal": unequal[:5]}
    print(json.dumps(report))


if __name__ == "__main__":
    main()
