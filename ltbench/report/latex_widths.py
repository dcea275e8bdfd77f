"""How wide a string is when pdflatex sets it: Computer Modern character widths, so the LaTeX writer can
choose a table layout that fits the page (``ltbench.report.latex``) without running TeX.

The widths are those of the TFM files of TeX Live's Computer Modern (``tftopl cmr9.tfm`` and so on), in
thousandths of the font's design size, for the printable ASCII characters 32 (space) to 126. Kerning and
ligatures are ignored (they only narrow a word), and a symbol set in math (±, ≈, ×, Greek) takes its
``cmsy``/``cmmi`` width. Venue fonts (Times in most two-column styles) are narrower than Computer Modern,
so a table that fits here fits there.
"""

from __future__ import annotations

FONTS = {  # font -> widths of chr(32) ... chr(126) in 1/1000 of the design size (TFM CHARWD)
    "cmr9": (
        343, 285, 514, 856, 514, 856, 799, 285, 400, 400, 514, 799, 285, 343, 285, 514, 514, 514,
        514, 514, 514, 514, 514, 514, 514, 514, 285, 285, 285, 799, 485, 485, 799, 771, 728, 742,
        785, 699, 671, 806, 771, 371, 528, 799, 642, 942, 771, 799, 699, 799, 756, 571, 742, 771,
        771, 1056, 771, 771, 628, 285, 514, 285, 514, 285, 285, 514, 571, 457, 571, 457, 314, 514,
        571, 285, 314, 542, 285, 856, 571, 514, 571, 542, 402, 405, 400, 571, 542, 742, 542, 542,
        457, 514, 1028, 514, 514),
    "cmbx9": (
        394, 360, 618, 986, 592, 986, 920, 329, 460, 460, 592, 920, 329, 394, 329, 592, 592, 592,
        592, 592, 592, 592, 592, 592, 592, 592, 329, 329, 360, 920, 559, 559, 920, 893, 841, 855,
        907, 777, 744, 930, 924, 446, 611, 926, 711, 1122, 924, 889, 808, 889, 887, 657, 823, 909,
        893, 1222, 893, 893, 723, 329, 618, 329, 592, 329, 329, 575, 657, 526, 657, 543, 362, 592,
        657, 329, 362, 625, 329, 986, 657, 592, 657, 625, 488, 467, 460, 657, 625, 855, 625, 625,
        526, 592, 1183, 592, 592),
    "cmti9": (
        367, 315, 528, 840, 786, 840, 787, 315, 420, 420, 525, 787, 315, 367, 315, 525, 525, 525,
        525, 525, 525, 525, 525, 525, 525, 525, 315, 315, 315, 787, 525, 525, 787, 763, 723, 735,
        775, 696, 670, 794, 763, 396, 539, 789, 644, 920, 763, 787, 696, 787, 749, 577, 735, 763,
        763, 1025, 763, 763, 630, 315, 528, 315, 525, 315, 315, 525, 472, 472, 525, 472, 315, 472,
        525, 315, 315, 472, 262, 840, 577, 525, 525, 472, 433, 420, 341, 551, 472, 682, 474, 498,
        420, 525, 1049, 525, 525),
    "cmr7": (
        385, 323, 569, 938, 569, 938, 877, 323, 446, 446, 569, 877, 323, 385, 323, 569, 569, 569,
        569, 569, 569, 569, 569, 569, 569, 569, 323, 323, 323, 877, 539, 539, 877, 843, 799, 815,
        860, 768, 737, 884, 843, 413, 583, 874, 706, 1028, 843, 877, 768, 877, 829, 631, 815, 843,
        843, 1151, 843, 843, 692, 323, 569, 323, 569, 323, 323, 569, 631, 508, 631, 508, 354, 569,
        631, 323, 354, 600, 323, 938, 631, 569, 631, 600, 446, 453, 446, 631, 600, 815, 600, 600,
        508, 569, 1139, 569, 569),
    "cmr6": (
        417, 352, 611, 1000, 611, 1000, 935, 352, 481, 481, 611, 935, 352, 417, 352, 611, 611, 611,
        611, 611, 611, 611, 611, 611, 611, 611, 352, 352, 352, 935, 579, 579, 935, 896, 851, 870,
        916, 819, 786, 942, 896, 443, 624, 929, 754, 1091, 896, 935, 819, 935, 883, 676, 870, 896,
        896, 1220, 896, 896, 741, 352, 611, 352, 611, 352, 352, 611, 676, 546, 676, 546, 384, 611,
        676, 352, 384, 644, 352, 1000, 676, 611, 676, 644, 481, 488, 481, 676, 644, 870, 644, 644,
        546, 611, 1222, 611, 611),
}
DESIGN_PT = {"cmr9": 9.0, "cmbx9": 9.0, "cmti9": 9.0, "cmr7": 7.0, "cmr6": 6.0}
# Characters the writer sets in math or as a macro (latex_escape), in em of the font they appear in.
# Greek letters are math italic: their width plus the italic correction TeX adds after them (τ: 0.45 + 0.11).
SYMBOL_EM = {"±": 0.80, "≈": 0.80, "−": 0.80, "×": 0.80, "·": 0.29, "✓": 0.84, "✗": 0.80, "τ": 0.57,
             "ρ": 0.57, "κ": 0.62, "α": 0.68, "β": 0.64, "Δ": 0.86, "†": 0.46, "–": 0.52, "—": 1.03,
             "é": 0.46, "<": 0.80, ">": 0.80,
             # ASCII that latex_escape turns into a macro (OT1 has other glyphs at these codes): \_ is a
             # 0.36 em rule with kerns, \{ \} come from the math symbols, \textbackslash and friends
             "_": 0.36, "{": 0.50, "}": 0.50, "\\": 0.50, "~": 0.50, "^": 0.50, "|": 0.28}
UNKNOWN_EM = 1.03  # a character outside these tables: as wide as an em quad (wider than most)
# Small sizes of Computer Modern are relatively wider: ± is 0.80 em in cmsy9 but 0.89 em in cmsy7.
SMALL_SYMBOLS = {"cmr7": 1.12, "cmr6": 1.2}


def text_width(text: str, font: str = "cmr9") -> float:
    """Width in points of ``text`` set in ``font`` (one of FONTS), before any LaTeX escaping."""
    table, size, wider = FONTS[font], DESIGN_PT[font], SMALL_SYMBOLS.get(font, 1.0)
    total = 0.0
    for ch in text:
        code = ord(ch)
        if 32 <= code <= 126 and ch not in SYMBOL_EM:
            total += table[code - 32] / 1000.0
        else:
            total += SYMBOL_EM.get(ch, UNKNOWN_EM) * wider
    return total * size
