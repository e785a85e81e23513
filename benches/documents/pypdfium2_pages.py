"""One Python process reading every page's text of the PDFs of a folder with pypdfium2, as
read_document does with the same pdfium: the yardstick of docs/performance.md's documents
figures. Prints the pages and characters read.

    python pypdfium2_pages.py FOLDER
"""

import os
import sys

import pypdfium2 as pdfium

pages = characters = 0
folder = sys.argv[1]
for name in sorted(os.listdir(folder)):
    if not name.endswith(".pdf"):
        continue
    document = pdfium.PdfDocument(os.path.join(folder, name))
    for i in range(len(document)):
        characters += len(document[i].get_textpage().get_text_range())
        pages += 1
    document.close()
print(pages, characters)
