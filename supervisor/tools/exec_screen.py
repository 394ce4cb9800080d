"""The exec tool's outer fence: a regex deny list (and an optional allow list) checked
in the supervisor before a command is dispatched to its sandbox.

This is the weakest layer and is meant to be: it stops the obvious accidents a model
makes (`rm -rf /`, `mkfs`, `curl … | sh`) with a refusal that names the rule, and
never a common harmless command. Anything it misses (`$(echo rm) -rf /`, a Python
one-liner) meets the sandbox, which is the real wall (tests/test_exec_containment.py).

Matching runs on a normalised command, not on the raw text: quotes and backslash
escapes are removed from words (`$'\x72m'` is decoded), bash brace expansion
(`{rm,-rf,/}`) and `$IFS` are applied, whitespace is collapsed, and the command is cut
into simple commands at `;`, `&&`, `||`, `&`, `|`, newlines and unquoted parentheses,
whether or not they touch a word, as the shell cuts them: `(reboot)` and
`true&&(rm -rf /)` are screened as `reboot` and `rm -rf /`. `$(…)`, backticks, `<(…)`,
`eval` and `sh -c`/`bash -c` strings are screened as commands of their own. Wrappers
(`sudo`, `env`, `nice`, `timeout`, `xargs`, `VAR=value`, a path before the command
name…) are peeled off, so that a rule can anchor on the command word and `echo reboot`
or `grep -r "rm -rf /" docs` stay allowed. Then every path argument is normalised
lexically (`.`, `..`, repeated and trailing slashes; in `of=PATH` and `>PATH` too), so
that `rm -rf /tmp/../` is matched as `rm -rf /` and `rm -rf ./build/../dist` as
`rm -rf dist`. A refusal names that normalised command. A quoted string is one word and
is not a command: `echo "(rm -rf /)"` passes.

Created from config by the gateway (and by `clawsup exec check|run`); immutable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MAX_DEPTH = 8
"""How deep `sh -c "sh -c '…'"` nesting is followed; deeper is refused outright."""
MAX_EXPANSION = 1024
"""How many words, finished or not, one word's brace expansion may make (`{a,b}{a,b}…`
doubles each time); more is refused outright rather than screened in part."""
MAX_EXPANSION_CHARS = 1 << 20
"""How many characters those words may hold in all, so a long word with a few braces
cannot make the screen itself slow."""


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    on: str = "command"
    """What the pattern is matched against: `command` (each simple command, wrappers
    peeled, with `re.search`), `pipeline` (the commands of one pipeline joined with
    " | ") or `text` (the whole normalised command, before cutting)."""


def _r(name: str, pattern: str, on: str = "command") -> Rule:
    return Rule(name, re.compile(pattern), on)


_SHELLS = r"(?:sh|bash|dash|zsh|ksh|mksh|ash|busybox\s+sh)"
# Targets are matched after path normalisation (`/tmp/..` is `/`, `~/` is `~`); the
# raw spellings stay for rules an operator adds. `/*/*` and `/???` reach every
# top-level folder as surely as `/*`; `~/..` and `../..` climb out of what they name,
# and `~bob` is a whole home as much as `~` is.
_SLASH_ROOT = r"(?:/+(?:[*?]+(?:/+[*?]+)*)?/*)"
_HOME = r"(?:~[\w.-]*|\$HOME|\$\{HOME\})"
_ROOTISH = rf"(?:{_SLASH_ROOT}|/+\.\.?/?\*?|{_HOME}(?:/+\.\.)*/?\*?|(?:\.\./+)*\.\./?\*?)"

DEFAULT_RULES: tuple[Rule, ...] = (
    # rm with a recursive flag anywhere and a root-like target anywhere.
    _r("recursive-delete-root", rf"^rm(?=(?:\s+\S+)*?\s+(?:-[a-zA-Z]*[rR][a-zA-Z]*|--recursive)(?:\s|$))(?=(?:\s+\S+)*?\s+{_ROOTISH}(?:\s|$))"),
    _r("recursive-delete-root", rf"^rm\s.*--no-preserve-root"),
    _r("recursive-delete-root", rf"^find\s+{_ROOTISH}\s.*-delete\b"),
    _r("make-filesystem", r"^(?:mkfs(?:\.\w+)?|mke2fs|mkswap|wipefs)(?:\s|$)"),
    _r("write-block-device", r"^dd\s(?:.*\s)?of=/dev/(?!null\b|zero\b|stdout\b|stderr\b|tty\b|fd/)"),
    _r("write-block-device", r"(?:^|\s)\d*>>?\|?\s*/dev/(?:sd|hd|vd|xvd|nvme|mmcblk|dm-|loop|md|disk/|mapper/)"),
    _r("write-block-device", r"^(?:shred|blkdiscard)\s(?:.*\s)?/dev/(?:sd|hd|vd|xvd|nvme|mmcblk|dm-|loop|md|disk/|mapper/)"),
    # `:(){ :|:& };:` and its renamings: a function that pipes itself into itself in
    # the background. Matched on the whole text, since cutting at `|` and `;` would
    # take the shape apart. The name is a whole run and the body is bounded, so that
    # a 100 kB command cannot make the search quadratic (a stalled supervisor).
    _r("fork-bomb", r"(?<![\w:.])([\w:.]++)\s*\(\)\s*\{[^}]{0,256}?\1\s*\|\s*\1\s*&", on="text"),
    _r("fork-bomb", r"\bfork\s+while\s+fork\b|\bwhile\s*\(?\s*(?:1|true|True)\s*\)?\s*:?\s*os\.fork\(\)", on="text"),
    _r("power-off", r"^(?:shutdown|reboot|halt|poweroff)(?:\s|$)"),
    _r("power-off", r"^(?:systemctl|loginctl)\s+(?:\S+\s+)*?(?:poweroff|reboot|halt|kexec)(?:\s|$)"),
    _r("power-off", r"^(?:init|telinit)\s+[06](?:\s|$)"),
    _r("recursive-chmod-root", rf"^(?:chmod|chown|chgrp)(?=(?:\s+\S+)*?\s+(?:-[a-zA-Z]*R[a-zA-Z]*|--recursive)(?:\s|$))(?=(?:\s+\S+)*?\s+{_SLASH_ROOT}(?:\s|$))"),
    _r("download-into-shell", rf"^(?:curl|wget|fetch)\s.*\|\s*{_SHELLS}(?:\s|$)", on="pipeline"),
    _r("download-into-shell", rf"^(?:curl|wget|fetch)\s.*\|\s*(?:python[\d.]*|perl|ruby|node)(?:\s+-)?\s*$", on="pipeline"),
    _r("download-into-shell", rf"(?:^|\s){_SHELLS}\s+(?:-\S+\s+)*(?:<\(|\$\(|`)\s*(?:curl|wget|fetch)\s"),
    _r("download-into-shell", rf"(?:^|\s)(?:{_SHELLS}\s+(?:-\S+\s+)*-\w*c|eval|source|\.)\s+(?:\$\(|`|<\()\s*(?:curl|wget|fetch)\s"),
)

_PREFIX_ONLY = {"!", "{", "}", "(", ")", "if", "then", "else", "elif", "do", "while", "until", "time", "coproc"}
# Wrappers that run their arguments as a command; with the options that take a value.
_WRAPPERS: dict[str, set[str]] = {
    "sudo": {"-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "-T"},
    "doas": {"-u", "-C"},
    "env": {"-u", "--unset", "-C", "--chdir", "-S", "--split-string"},
    "nice": {"-n", "--adjustment"},
    "ionice": {"-c", "-n", "-p", "-t"},
    "nohup": set(),
    "setsid": set(),
    "command": set(),
    "builtin": set(),
    "exec": {"-a"},
    "stdbuf": {"-i", "-o", "-e"},
    "timeout": {"-s", "--signal", "-k", "--kill-after"},
    "xargs": {"-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s", "--arg-file", "--delimiter", "--max-args", "--max-procs"},
    "chrt": set(),
    "taskset": set(),
    "unbuffer": set(),
    "busybox": set(),
    "strace": {"-e", "-o", "-p", "-s"},
}
_TAKES_POSITIONAL = {"timeout": 1, "chrt": 1, "taskset": 1}
_SHELL_NAMES = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    rule: str | None = None
    segment: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"allowed": self.allowed, "rule": self.rule, "segment": self.segment}

    def explain(self) -> str:
        if self.allowed:
            return "allowed"
        if self.rule == "allowlist":
            return f"refused: {self.segment!r} matches no pattern of tools.exec.allow"
        return f"refused by rule {self.rule!r}: it matched {self.segment!r}"


@dataclass(frozen=True)
class ExecScreen:
    rules: tuple[Rule, ...] = DEFAULT_RULES
    allow: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def build(cls, *, use_defaults: bool = True, deny: Mapping[str, str] | None = None, allow: Iterable[str] = ()) -> ExecScreen:
        """Patterns are compiled here; the config model has already checked them."""
        rules = list(DEFAULT_RULES if use_defaults else ())
        rules += [_r(name, pattern) for name, pattern in (deny or {}).items()]
        return cls(tuple(rules), tuple(re.compile(p) for p in allow))

    def check(self, command: str) -> Verdict:
        try:
            parsed = parse(command)
        except _TooDeep:
            return Verdict(False, "nesting-too-deep", command.strip()[:200])
        except _TooLarge:
            return Verdict(False, "expansion-too-large", command.strip()[:200])
        for text in parsed.texts:
            for rule in self.rules:
                if rule.on == "text" and rule.pattern.search(text):
                    return Verdict(False, rule.name, text)
        for pipeline in parsed.pipelines:
            joined = " | ".join(pipeline)
            for rule in self.rules:
                if rule.on == "pipeline" and rule.pattern.search(joined):
                    return Verdict(False, rule.name, joined)
            for cmd in pipeline:
                for rule in self.rules:
                    if rule.on == "command" and rule.pattern.search(cmd):
                        return Verdict(False, rule.name, cmd)
        if self.allow:
            for pipeline in parsed.pipelines:
                for cmd in pipeline:
                    if cmd and not any(p.search(cmd) for p in self.allow):
                        return Verdict(False, "allowlist", cmd)
        return Verdict(True)


# --- parsing -------------------------------------------------------------------


class _TooDeep(Exception):
    pass


class _TooLarge(Exception):
    pass


@dataclass
class Parsed:
    pipelines: list[list[str]] = field(default_factory=list)
    """Each pipeline: its simple commands, normalised, wrappers peeled."""
    texts: list[str] = field(default_factory=list)
    """Each command string seen (the top one, and every nested one), normalised."""


def parse(command: str) -> Parsed:
    out = Parsed()
    _parse_into(command, out, 0)
    return out


def _parse_into(command: str, out: Parsed, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _TooDeep
    pipelines, nested, flat = _tokenize(command)
    out.texts.append(flat)
    for inner in nested:
        _parse_into(inner, out, depth + 1)
    for pipeline in pipelines:
        cmds = []
        for words in pipeline:
            words = _peel(words)
            if not words:
                continue
            cmds.append(" ".join([words[0], *map(_normalise_word, words[1:])]))
            # What a shell or eval would run is screened as a command of its own
            # (from the words as written: a command string is not a path).
            for inner in _inner_commands(words):
                _parse_into(inner, out, depth + 1)
        if cmds:
            out.pipelines.append(cmds)


def _tokenize(s: str) -> tuple[list[list[list[str]]], list[str], str]:
    """Shell-ish word splitting, enough for screening (not for running).

    Returns (pipelines of commands of words, the bodies of substitutions, the whole
    command normalised as one line). A substitution stays in its word as written, so
    that a rule can see `sh <(curl …)`."""
    pipelines: list[list[list[str]]] = []
    pipeline: list[list[str]] = []
    words: list[str] = []
    nested: list[str] = []
    word: list[str] | None = None
    i, n = 0, len(s)

    def end_word() -> None:
        nonlocal word
        if word is not None:
            words.extend(_expand_braces("".join(word)))
            word = None

    def end_command() -> None:
        nonlocal words
        end_word()
        if words:
            pipeline.append(words)
        words = []

    def end_pipeline() -> None:
        nonlocal pipeline
        end_command()
        if pipeline:
            pipelines.append(pipeline)
        pipeline = []

    def take_sub(start: int) -> int:
        """`s[start]` opens `$(`, `<(`, `>(` or a backtick; returns the index after
        its end and records its body."""
        if s[start] == "`":
            j = start + 1
            body = []
            while j < n and s[j] != "`":
                if s[j] == "\\" and j + 1 < n:
                    j += 1
                body.append(s[j])
                j += 1
            nested.append("".join(body))
            return min(j + 1, n)
        j = start + 2
        level = 1
        quote = ""
        while j < n and level:
            c = s[j]
            if quote:
                if c == quote:
                    quote = ""
                elif c == "\\" and quote == '"':
                    j += 1
            elif c in "'\"":
                quote = c
            elif c == "\\":
                j += 1
            elif c == "(":
                level += 1
            elif c == ")":
                level -= 1
            j += 1
        nested.append(s[start + 2 : j - 1 if level == 0 else j])
        return j

    while i < n:
        c = s[i]
        if c in " \t\r":
            end_word()
            i += 1
        elif c == "\n" or c == ";":
            end_pipeline()
            i += 1
        elif c == "&":
            if s.startswith("&&", i):
                end_pipeline()
                i += 2
            elif word is not None and word and word[-1] in "<>":
                word.append(c)  # `2>&1`
                i += 1
            else:
                end_pipeline()
                i += 1
        elif c == "|":
            if s.startswith("||", i):
                end_pipeline()
                i += 2
            else:
                end_command()
                i += 1
                if i < n and s[i] == "&":
                    i += 1
        elif c in "()":
            # Unquoted, a parenthesis is an operator even where it touches a word:
            # `(reboot)` runs `reboot`. (`$(`, `<(` and `>(` never get here.)
            end_pipeline()
            i += 1
        elif c == "#" and word is None:
            while i < n and s[i] != "\n":
                i += 1
        elif c == "\\":
            if i + 1 < n and s[i + 1] == "\n":
                i += 2
                continue
            word = word if word is not None else []
            if i + 1 < n:
                word.append(s[i + 1])
            i += 2
        elif c == "'":
            word = word if word is not None else []
            j = s.find("'", i + 1)
            j = n if j < 0 else j
            word.append(s[i + 1 : j])
            i = j + 1
        elif c == '"':
            word = word if word is not None else []
            i += 1
            while i < n and s[i] != '"':
                if s[i] == "\\" and i + 1 < n and s[i + 1] in '"\\$`\n':
                    word.append(s[i + 1])
                    i += 2
                elif s.startswith("$(", i) or s[i] == "`":
                    j = take_sub(i)
                    word.append(s[i:j])
                    i = j
                else:
                    word.append(s[i])
                    i += 1
            i += 1
        elif s.startswith("$(", i) or c == "`" or ((c == "<" or c == ">") and s.startswith("(", i + 1)):
            word = word if word is not None else []
            j = take_sub(i)
            word.append(s[i:j])
            i = j
        elif s.startswith("$'", i):
            word = word if word is not None else []
            j = i + 2
            while j < n and s[j] != "'":
                j += 2 if s[j] == "\\" else 1
            word.append(_ansi_c(s[i + 2 : j]))
            i = j + 1
        elif s.startswith('$"', i):
            i += 1  # a translated string: a double-quoted one for screening
        elif (m := _IFS.match(s, i)) is not None:
            end_word()  # unquoted, it splits the word
            i = m.end()
        elif (m := _PARAM.match(s, i)) is not None:
            # A plain parameter expansion, kept whole: its braces and commas
            # (`${x,,}`) are not brace expansion. One that holds a substitution
            # (`${x:-$(reboot)}`) is read char by char, so that it is screened.
            word = word if word is not None else []
            word.append(m.group())
            i = m.end()
        else:
            word = word if word is not None else []
            word.append(_BRACE_MARK.get(c, c))
            i += 1
    end_pipeline()
    return pipelines, nested, _flatten(s)


_IFS = re.compile(r"\$(?:\{IFS\}|IFS(?![A-Za-z0-9_]))")
_PARAM = re.compile(r"\$\{[^{}$`'\"()\s]*\}")
# Unquoted `{`, `,` and `}` are marked while a word is read, so that brace expansion
# applies to them and not to quoted ones; marks left over are put back as written.
_OPEN, _COMMA, _CLOSE = "\ue000", "\ue001", "\ue002"
_BRACE_MARK = {"{": _OPEN, ",": _COMMA, "}": _CLOSE}
_UNMARK = str.maketrans({_OPEN: "{", _COMMA: ",", _CLOSE: "}"})


def _expand_braces(word: str) -> list[str]:
    """bash's `{a,b}` expansion (not `{1..3}`): `{rm,-rf,/}` is three words, `/{tmp/..,}`
    two. sh does not expand, so this only ever screens more than sh runs."""
    if _OPEN not in word:
        return [word]
    done: list[str] = []
    todo = [word]
    made = chars = 0
    while todo:
        w = todo.pop()
        found = _brace_pair(w)
        if found is None:
            if w:  # bash drops an empty result: `sh -c {,} 'reboot'` is `sh -c reboot`
                done.append(w.translate(_UNMARK))
            continue
        start, commas, end = found
        cuts = [start, *commas, end]
        new = [w[:start] + w[a + 1 : b] + w[end + 1 :] for a, b in zip(cuts, cuts[1:])]
        made += len(new)
        chars += sum(map(len, new))
        if made > MAX_EXPANSION or chars > MAX_EXPANSION_CHARS:
            raise _TooLarge
        todo += new[::-1]
    return done


def _brace_pair(w: str) -> tuple[int, list[int], int] | None:
    """The leftmost marked `{…}` with a comma at its own level: (open, commas, close).
    One pass: a word of many braces costs no more than its length."""
    stack: list[tuple[int, list[int]]] = []
    best = None
    for j, c in enumerate(w):
        if c == _OPEN:
            stack.append((j, []))
        elif c == _COMMA and stack:
            stack[-1][1].append(j)
        elif c == _CLOSE and stack:
            start, commas = stack.pop()
            if commas and (best is None or start < best[0]):
                best = (start, commas, j)
    return best


_ANSI_C = re.compile(r"\\(x[0-9a-fA-F]{1,2}|u[0-9a-fA-F]{1,4}|U[0-9a-fA-F]{1,8}|[0-7]{1,3}|c.|.)", re.S)
_ANSI_C_SIMPLE = {"a": "\a", "b": "\b", "e": "\x1b", "E": "\x1b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _ansi_c(body: str) -> str:
    """The text of bash's `$'…'` string: `$'\x72\155'` is `rm`."""

    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xuU" and len(e) > 1:
            return chr(min(int(e[1:], 16), 0x10FFFF))
        if e[0] in "01234567":
            return chr(int(e, 8) & 0xFF)
        if e[0] == "c" and len(e) == 2:
            return chr(ord(e[1].upper()) & 0x1F)
        return _ANSI_C_SIMPLE.get(e, e)

    return _ANSI_C.sub(one, body)


_PATH_PREFIX = re.compile(r"^(?:\d*[<>]+[|&]?|&>>?|--?[\w-]+=|[A-Za-z_]\w*=)")
_PATH_ANCHOR = re.compile(r"^(?:/+|(?:~[\w.-]*|\$\{?\w+\}?)(?=/|$))")


def _normalise_word(word: str) -> str:
    """A path argument, lexically normalised; any other word as it is. Also the path
    in `of=PATH`, `--opt=PATH` and a redirection `>PATH`."""
    if any(c.isspace() for c in word) or "://" in word or "$(" in word or "`" in word:
        return word  # a sentence, a URL or a substitution: not a path to normalise
    m = _PATH_PREFIX.match(word)
    head, path = (word[: m.end()], word[m.end() :]) if m else ("", word)
    if path.startswith("-") or ("/" not in path and path not in (".", "..")):
        return word
    return head + _normalise_path(path)


def _normalise_path(path: str) -> str:
    """`.`, `..` and repeated and trailing slashes resolved without the filesystem.
    `..` climbs a component but not an anchor: `/..` is `/`; `~/..`, `$HOME/..` and
    `../..` stay, since they do climb out of what they name."""
    m = _PATH_ANCHOR.match(path)
    anchor = "" if m is None else "/" if m.group().startswith("/") else m.group()
    parts: list[str] = []
    for part in path[m.end() if m else 0 :].split("/"):
        if part in ("", "."):
            continue
        if part != "..":
            parts.append(part)
        elif parts and parts[-1] != "..":
            parts.pop()
        elif anchor != "/":
            parts.append("..")
    if anchor == "/":
        return "/" + "/".join(parts)
    if anchor:
        return "/".join([anchor, *parts])
    return "/".join(parts) or "."


def _flatten(s: str) -> str:
    """The whole command on one line, quotes and escapes gone, operators kept."""
    return re.sub(r"\s+", " ", re.sub(r"\\\n|[\\'\"]", "", s)).strip()


def _peel(words: list[str]) -> list[str]:
    """Drop what runs the real command without being it: assignments, keywords,
    wrappers and their options, and a path before the command's name."""
    i = 0
    while i < len(words):
        w = words[i]
        if w in _PREFIX_ONLY or _ASSIGNMENT.match(w):
            i += 1
            continue
        is_path = "/" in w and not w.endswith("/") and "$(" not in w and "`" not in w
        name = w.rsplit("/", 1)[-1] if is_path else w
        if name in _WRAPPERS:
            takes = _WRAPPERS[name]
            i += 1
            while i < len(words) and (words[i].startswith("-") or (name == "env" and _ASSIGNMENT.match(words[i]))):
                opt = words[i]
                i += 2 if opt in takes else 1
            i += _TAKES_POSITIONAL.get(name, 0)
            continue
        return [name, *words[i + 1 :]]
    return []


def _inner_commands(words: list[str]) -> list[str]:
    """The command strings a shell (`sh -c STR`) or `eval` would run."""
    name = words[0]
    if name == "eval":
        return [" ".join(words[1:])]
    if name in _SHELL_NAMES:
        for k, w in enumerate(words[1:], start=1):
            if w.startswith("-") and not w.startswith("--") and "c" in w[1:]:
                return [words[k + 1]] if k + 1 < len(words) else []
            if not w.startswith("-"):
                break
    return []
