"""Finding the code blocks of a page, and telling which shell commands a test may run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import Block, blocks, is_safe, shell_script

PAGE = Path("page.md")


def test_blocks_keep_their_language_line_and_dedented_code() -> None:
    text = "intro\n\n```python\nprint(1)\n```\n\n- a list item:\n\n  ```bash\n  timers --help\n  ```\n"
    assert blocks(text, PAGE) == [
        Block(PAGE, 3, "python", "print(1)\n"),
        Block(PAGE, 9, "bash", "timers --help\n"),
    ]


def test_a_longer_fence_holds_a_shorter_one() -> None:
    text = "````text\n```python\nx\n```\n````\n"
    assert blocks(text, PAGE) == [Block(PAGE, 1, "text", "```python\nx\n```\n")]


def test_an_unclosed_block_is_an_error() -> None:
    with pytest.raises(ValueError, match="page.md:1: a code block is never closed"):
        blocks("```python\nprint(1)\n", PAGE)


def test_a_console_block_runs_its_prompted_lines_only() -> None:
    block = Block(PAGE, 1, "console", "$ timers --version\nkafka-timers 0.1.0\n")
    assert shell_script(block) == "timers --version\n"


@pytest.mark.parametrize(
    ("script", "safe"),
    [
        ("timers --help\n", True),
        ("timers schedule --help  # the options\n", True),
        ("timers-worker --version\n", True),
        ("timers watch hello --from-beginning --count 1 --timeout 30s\n", True),
        ("timers schedule --topic t --key k --value 'hi there' --delay 3s\n", True),
        ("timers watch hello --count 1\n", False),  # would wait forever without a record
        ("timers-worker\n", False),  # a service: runs until stopped
        ("timers broker\n", False),
        ("timers --help; rm -rf build\n", False),
        ("timers --help && make clean\n", False),
        ('timers schedule --topic t --key k --value "$(cat secret)" --delay 1s\n', False),
        ("export A=1\ntimers --help\n", False),
        ("# only a comment\n", False),
    ],
)
def test_only_commands_that_end_by_themselves_and_change_nothing_are_run(script: str, safe: bool) -> None:
    assert is_safe(script) is safe
