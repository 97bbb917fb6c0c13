"""Answer checking, shared by every stage that grades a model (RCL rewards, evaluation, compare).

`extract_answer` finds the final answer in a model's output; `normalize` puts answers in a canonical form
(numbers, fractions, `\\boxed{}`, thousands separators, LaTeX wrappers, multiple-choice letters); `is_correct`
compares the two. The order of extraction is documented in docs/evaluation.md and fixed by tests.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?"
# The sentence ends at a full stop that is not a decimal point ("is 3.5", "is 42.**"), or at the line's end.
_ANSWER_IS = re.compile(
    r"(?:final answer|answer)\s*(?:is|:|=)\s*[:\s]*\$?([^\n$]+?)\$?\s*(?:\.(?!\d)|$)", re.IGNORECASE | re.MULTILINE
)
_CHOICE = re.compile(r"^\(?([A-J])\)?$|^\(?([A-J])[.)]:?\s")
_LAST_NUMBER = re.compile(_NUMBER)
# An answer block of several numbers joined by "," ";" "or" "and" (each maybe "x = "), maybe in brackets: a tuple, an
# interval, a list of roots, or a hedge ("3 or 4"). It is an answer of its own, read whole: its last number would pay
# a hedge. Only answer blocks: the built-in checkers (tasks.check_sums, the teaching comparison's grader) read as before.
_ITEM = r"(?:[a-z]\s*=\s*)?-?\d+(?:\.\d+)?(?:/\d+)?"
_LIST = re.compile(rf"[(\[]?\s*{_ITEM}(?:\s*(?:,|;|\bor\b|\band\b)\s*{_ITEM})+\s*[)\]]?\.?")


def boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...} / \\fbox{...}, with nested braces balanced."""
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1])
    return out


def between(text: str, start: str, end: str, *, last: bool = False, open_end: bool = False) -> str | None:
    """The text between the tag `start` (its first occurrence, or its last with `last`) and the next `end`.
    None when `start` is missing; when `end` never follows it, None, or the rest of the text with `open_end`.
    The one tag slicer of the package: prompts, data rows, answers, guidance and grading all read tags with it."""
    i = text.rfind(start) if last else text.find(start)
    if i < 0:
        return None
    i += len(start)
    j = text.find(end, i)
    if j < 0:
        return text[i:] if open_end else None
    return text[i:j]


def extract_answer(text: str, answer_tags: tuple[str, str] | None = None, last_number: bool = True) -> str | None:
    """The final answer in `text`, or None. Order: answer tags, last \\boxed{}, 'answer is …', the last number."""
    if answer_tags:
        inside = between(text, *answer_tags, last=True)
        if inside is not None:
            # A block that is itself the answer (a number, a fraction, a LaTeX expression: `\frac{1}{2}`, `2\pi`)
            # is taken whole: its last number would be a denominator or an exponent. A block that holds a box or a
            # sentence is read with the same rules as the whole text.
            if _whole_answer(inside):
                return inside.strip()
            return extract_answer(inside, last_number=last_number) or (inside.strip() or None)
    boxes = boxed_contents(text)
    if boxes:
        return boxes[-1].strip()
    said: list[str] = _ANSWER_IS.findall(text)  # one group: findall gives its text per match
    if said:
        return said[-1].strip()
    numbers: list[str] = _LAST_NUMBER.findall(text) if last_number else []
    return numbers[-1] if numbers else None


def _whole_answer(block: str) -> bool:
    """Is an answer block the answer itself: an exact number once normalised, or LaTeX math with no words in it
    (words: two letters or more, outside a LaTeX command and `\\text{}`), and no box (a box is looked into)?"""
    if not block.strip() or boxed_contents(block):
        return False
    if re.fullmatch(r"-?\d+(?:/\d+)?", normalize(block) or "") or _LIST.fullmatch(_unlatex(block).strip()):
        return True
    if "=" in block:  # a derivation ("2^{10} = 1024"): its answer is what it ends with
        return False
    math = _unlatex(block)  # fractions, \text{}, delimiters and spacing out of the way: what is left is math or prose
    return bool(re.search(r"[\\^_{]", math)) and not re.search(r"[A-Za-z]{2,}", re.sub(r"\\[A-Za-z]+", " ", math))


def _unlatex(s: str) -> str:
    s = re.sub(r"\\(?:d|t)?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}", r"(\1)/(\2)", s)
    s = re.sub(r"\\text\s*\{([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:left|right|,|;|!|\s|\(|\)|\[|\])", "", s)  # sizing, spacing and math delimiters
    return s.replace("\\%", "%").replace("\\$", "$").replace("$", "")


def normalize(answer: str | None) -> str | None:
    """Canonical form: exact numbers as reduced fractions or integers, choices as a letter, else folded text."""
    if answer is None:
        return None
    s = answer.strip()
    boxes = boxed_contents(s)
    if boxes:
        s = boxes[-1]
    s = _unlatex(s).strip().rstrip(".").strip()
    choice = _CHOICE.match(s)
    if choice:
        return choice.group(1) or choice.group(2)
    s = re.sub(r"^[a-z]\s*=\s*", "", s)  # "x = 5" -> "5"
    number = s.replace(" ", "").rstrip("%")
    number = re.sub(r"(?<=\d),(?=\d{3}\b)", "", number)  # 1,234 -> 1234 (not 1,2)
    number = re.sub(r"^\((-?[\d.]+)\)/\((-?[\d.]+)\)$", r"\1/\2", number)
    try:
        value = Fraction(number)
    except (ValueError, ZeroDivisionError):
        return re.sub(r"\s+", " ", s).lower()
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def is_correct(output: str, reference: str, answer_tags: tuple[str, str] | None = None) -> bool:
    """Does the answer extracted from `output` equal the reference answer (itself extracted if it is a sentence)?"""
    got = normalize(extract_answer(output, answer_tags))
    # A reference is an answer unless it marks one ("The answer is 98.", a box, answer tags); inside its answer tags
    # it is read as an output's block is ("18 dollars" is 18), outside them never by a last number.
    tagged = answer_tags is not None and answer_tags[0] in reference
    want = normalize(extract_answer(reference, answer_tags, last_number=tagged) or reference)
    return got is not None and got == want
