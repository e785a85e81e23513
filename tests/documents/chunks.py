"""Checks read_document's pages cut by `chunk` against the model's tokenizer as Hugging Face's
`tokenizers` package reads tokenizer.json, and against Python's own string offsets.

usage: chunks.py PAGES.json CHUNKS.json TOKENIZER.json MAX_TOKENS

PAGES.json: a row per page (filename, page, text); CHUNKS.json: a row per chunk (filename,
page, text, char_start, char_end, tokens), newline-delimited JSON as batchinfer's COPY writes
it. Prints a JSON report: chunks over MAX_TOKENS, token counts that differ from the
tokenizer's, offsets that do not give the chunk's text, characters (not white space) of a page
in no chunk, and how chunks end (paragraph, sentence, line, word, within a word) beside fixed
windows of MAX_TOKENS tokens cut without looking (the baseline).
"""

import json
import re
import sys
from collections import Counter, defaultdict

from tokenizers import Tokenizer

SENTENCE_END = re.compile(r"[.!?…。！？][\"')\]”’»]*$")


def rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def ending(text, end):
    """How `text` is cut at character `end`: what lies on either side."""
    before, after = text[:end], text[end:]
    space = after[: len(after) - len(after.lstrip())]
    if space.count("\n") >= 2:
        return "paragraph"
    if SENTENCE_END.search(before.rstrip()) and (space or before.endswith(("。", "！", "？"))):
        return "sentence"
    if "\n" in space:
        return "line"
    if space or not before or not before[-1].isalnum() or not after[:1].isalnum():
        return "word"
    return "within a word"


def main():
    pages_path, chunks_path, tokenizer_path, max_tokens = sys.argv[1:5]
    max_tokens = int(max_tokens)
    tokenizer = Tokenizer.from_file(tokenizer_path)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    pages = {(r["filename"], r["page"]): r.get("text") or "" for r in rows(pages_path)}
    chunks = defaultdict(list)
    for r in rows(chunks_path):
        chunks[(r["filename"], r["page"])].append(r)
    report = Counter()
    ends, baseline = Counter(), Counter()
    for key, text in pages.items():
        of_page = sorted(chunks.get(key, []), key=lambda c: c["char_start"])
        covered = [False] * len(text)
        for c in of_page:
            report["chunks"] += 1
            start, end = c["char_start"], c["char_end"]
            if text[start:end] != c["text"]:
                report["offsets wrong"] += 1
            count = len(tokenizer.encode(c["text"]).ids)
            if count != c["tokens"]:
                report["token counts differ"] += 1
            if count > max_tokens:
                report["over max_tokens"] += 1
            for i in range(start, min(end, len(text))):
                covered[i] = True
            if end < len(text.rstrip()):
                ends[ending(text, end)] += 1
        report["characters in no chunk"] += sum(
            1 for ch, seen in zip(text, covered) if not seen and not ch.isspace()
        )
        # The baseline: windows of the room a chunk has, cut where they fall.
        encoding = tokenizer.encode(text, add_special_tokens=False)
        room = max_tokens - (len(tokenizer.encode("").ids))
        offsets = [o for o in encoding.offsets if o[1] > o[0]]
        for k in range(room, len(offsets), room):
            baseline[ending(text, offsets[k - 1][1])] += 1
    total = sum(ends.values()) or 1
    base_total = sum(baseline.values()) or 1
    report["ends"] = {k: round(v / total, 4) for k, v in ends.items()}
    report["baseline ends"] = {k: round(v / base_total, 4) for k, v in baseline.items()}
    report["pages"] = len(pages)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
