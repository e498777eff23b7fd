"""The dashboard (the only package that imports Textual).

Textual paints at most `TEXTUAL_FPS` times a second and a change waits for the next paint: at its default
(60) up to 17 ms. The dashboard asks for 120 unless the user set it, for a shorter key to screen; a paint
happens only when something changed, so an idle dashboard costs the same.
"""

import os

os.environ.setdefault("TEXTUAL_FPS", "120")  # read once, when Textual is first imported (after this)
