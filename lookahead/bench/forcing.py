"""Force a model to replay recorded outputs, on the device, once per forward: timing runs real forwards of a
random-weight model of a real shape on a real workload.

`ForcedOutputs` is a forward hook that overwrites the model's output logits with a one-hot (0 / -1e4) of each row's
recorded next token. The recorded sequences (prompt + output + eos) sit on the device as one tensor [R, Lmax];
a forward's column at position p gets ``sequence[p + 1]``, gathered with the forward's own ``position_ids``: no host
work per position, nothing that grows with the draft.

Why by position, and why that is exact for drafts and trees: a verification forward scores each draft token at
its own position; greedy acceptance keeps a token only if the target's choice at the previous column equals it, so
an accepted column's whole prefix equals the recording, and the token the recording has after that position is
what the target would write there. A rejected column's forced token is never used. In a tree, node j sits at
position ``pos + depth(j)`` (its ancestors' path, not its index); it is accepted only when every node on its path
was, that is when its path equals the recording from ``pos`` on, so ``sequence[pos + depth(j) + 1]`` is again the
right next token, whatever siblings the tree holds.

Rows are told apart by their prompt: at the prefill (a forward whose 2-D attention mask covers only its inputs, or
the first forward after `reset`) each row's prompt is looked up once on the host. lookahead drops finished rows
from its batch; when a forward comes with fewer rows, the survivors (who keep their order) are matched once more,
by the (position, token) of their first input against the recorded sequences of the previous rows. lookahead's
static cache says itself which call row each batch row holds (`SlotCache.origin`, a device tensor): there the
hook reads it, on the device, so that a captured forward needs no host work when the batch is compacted.

One instance should serve a whole run: a CUDA graph captured during a forward keeps the addresses of the tensors the
hook used then (`rows` and `table` are updated in place for that reason).

Example::

    forced = ForcedOutputs(traces, eos_token_id=eos, device=model.device)
    handle = forced.attach(model)
    forced.reset()
    out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=128)
    handle.remove()
"""
from __future__ import annotations

import numpy as np
import torch

LOW = -1e4  # the logit of every token but the recorded one
KEY_LEN = 48  # prompt tokens that sort prompts into groups (a row is then matched by its whole prompt)


class ForcedOutputs:
    """A forward hook that makes a model's greedy choice the recorded next token of each row (see module docstring).

    Args:
        traces: (prompt_ids, output_ids) pairs; no prompt may be a prefix of another (`distinct_prompts` keeps such
            traces) nor start with ``pad_token_id``.
        eos_token_id: written after each recorded output (and forced once it is exhausted).
        device: where the recorded sequences live (the model's device).
        pad_token_id: the left-padding id, stripped when a forward carries no usable mask (default: eos).

    Raises:
        ValueError: no traces, an empty prompt, a prompt starting with the pad id, or one prompt a prefix of another.
    """

    def __init__(self, traces, eos_token_id: int, device="cpu", pad_token_id: int | None = None):
        self.eos, self.pad = int(eos_token_id), int(eos_token_id if pad_token_id is None else pad_token_id)
        if not traces:
            raise ValueError("traces must hold at least one (prompt, output) pair, got none")
        self.sequences = [np.concatenate([np.asarray(p, np.int64), np.asarray(o, np.int64), [self.eos]])
                          for p, o in traces]
        prompts = [[int(t) for t in p] for p, _ in traces]
        if not all(prompts):
            raise ValueError("every prompt must hold at least one token, got an empty one")
        if any(p[0] == self.pad for p in prompts):
            raise ValueError(f"a prompt starts with pad_token_id={self.pad}; choose another pad id")
        self.prompt_lens = [len(p) for p in prompts]
        self.key_len = min(KEY_LEN, *self.prompt_lens)
        self.groups = {}  # first key_len prompt tokens -> [(trace, prompt)]
        for row, prompt in enumerate(prompts):
            group = self.groups.setdefault(tuple(prompt[: self.key_len]), [])
            for other, seen in group:
                if _prefix(seen, prompt) or _prefix(prompt, seen):
                    raise ValueError(f"the prompts of traces {other} and {row} are prefixes of one another; rows could "
                                     "not be told apart (see distinct_prompts)")
            group.append((row, prompt))
        self.width = max(len(s) for s in self.sequences) + 1  # one eos past the longest, for clamped positions
        table = np.full((len(self.sequences), self.width), self.eos, dtype=np.int64)
        for r, seq in enumerate(self.sequences):
            table[r, : len(seq)] = seq
        self.table = torch.from_numpy(table).to(device)  # [R, Lmax]
        self.rows = torch.zeros(len(self.sequences), dtype=torch.long, device=device)  # batch row -> trace
        self.batch, self._rows = 0, []  # rows known (0: none yet), and their traces on the host
        self.identified = 0  # host look-ups made (once per call, and once per shrink of lookahead's batch)

    def attach(self, model):
        """Register the hook on `model` (its output must have `.logits`); returns the handle to `.remove()`."""
        return model.register_forward_hook(self.hook, with_kwargs=True)

    def reset(self) -> None:
        """Forget the rows: the next forward (a prefill) identifies them by their prompts."""
        self.batch, self._rows = 0, []

    def hook(self, module, args, kwargs, output):
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        logits = output.logits  # [b, q', V], q' <= q (the prefill may keep the last column only)
        b, q = input_ids.shape
        mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
        if positions is None and mask is None:
            return output  # neither a prompt nor a step of a call (`lookahead.calibrate` timing forwards): left alone
        if positions is None:
            positions = _positions(mask, q, input_ids.device)
        prefill = mask is not None and mask.dim() == 2 and mask.shape[-1] == q
        origin = getattr(kwargs.get("cache", kwargs.get("past_key_values")), "origin", None)  # lookahead's static
        rows = self.rows[:b]  # cache: the call row each batch row holds, on the device
        if self.batch == 0 or prefill:
            if not self._identify(input_ids, mask if prefill else None):
                return output  # not a prompt of the traces (e.g. a calibration forward): leave it alone
        elif origin is not None:
            rows = self.rows[origin[:b]]
        elif b != self.batch:
            self._survivors(input_ids, positions)
        at = (positions[:, -logits.shape[1]:] + 1).clamp(max=self.width - 1)  # [b, q'] next position
        nxt = self.table[rows[:, None], at]  # [b, q'] recorded next tokens
        logits.fill_(LOW).scatter_(-1, nxt[..., None], 0.0)
        return output

    def _identify(self, input_ids: torch.Tensor, mask) -> bool:
        """Find the recorded prompt each row starts with (host work, once per call: HF's prompt lookup sends the
        prompt and its first draft in one forward); False when some row starts with none."""
        ids = input_ids.tolist()
        keep = mask.bool().tolist() if mask is not None else None
        rows = []
        for i, row in enumerate(ids):
            tokens = [t for t, k in zip(row, keep[i]) if k] if keep is not None else _strip(row, self.pad)
            group = self.groups.get(tuple(tokens[: self.key_len]), [])
            rows.append(next((r for r, prompt in group if _prefix(prompt, tokens)), None))
        if None in rows:
            return False
        self._set(rows)
        return True

    def _survivors(self, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        """After lookahead dropped finished rows: match the survivors, in order, to the previous rows."""
        first = torch.stack([input_ids[:, 0], positions[:, 0]], dim=1).tolist()  # one sync, once per shrink
        rows, j = [], 0
        for token, pos in first:
            while j < len(self._rows) and not _holds(self.sequences[self._rows[j]], pos, token):
                j += 1
            if j == len(self._rows):
                raise RuntimeError(f"forced replay: a row with token {token} at position {pos} follows none of the "
                                   f"{len(self._rows)} previous rows' recordings")
            rows.append(self._rows[j])
            j += 1
        self._set(rows)

    def _set(self, rows: list) -> None:
        self.rows[: len(rows)].copy_(torch.tensor(rows, dtype=torch.long))  # in place: a fixed address for graphs
        self.batch, self._rows = len(rows), rows
        self.identified += 1

    def row_of(self, prompt) -> int:
        """The trace whose prompt is `prompt` (KeyError when none is)."""
        tokens = [int(t) for t in prompt]
        group = self.groups.get(tuple(tokens[: self.key_len]), [])
        row = next((r for r, p in group if p == tokens), None)
        if row is None:
            raise KeyError("no trace has this prompt")
        return row

    def expected(self, row: int, max_new: int) -> list:
        """The new tokens a forced run must write for trace `row` with at most `max_new` new tokens (the eos
        included when the recording ends first)."""
        start = self.prompt_lens[row]
        return self.sequences[row][start: start + max_new].tolist()


def _positions(mask, q: int, device) -> torch.Tensor:
    """Position ids of the last q columns from a 2-D attention mask (models called without position_ids)."""
    if mask is None or mask.dim() != 2:
        raise ValueError("forced replay needs position_ids or a 2-D attention_mask in the forward's arguments")
    return (mask.long().cumsum(-1) - 1).clamp(min=0)[:, -q:].to(device)


def _strip(row: list, pad: int) -> list:
    """A row without its left padding."""
    start = next((i for i, t in enumerate(row) if t != pad), len(row))
    return row[start:]


def _prefix(short: list, long: list) -> bool:
    return len(short) <= len(long) and long[: len(short)] == short


def _holds(sequence: np.ndarray, pos: int, token: int) -> bool:
    return 0 <= pos < len(sequence) and int(sequence[pos]) == token


def distinct_prompts(traces) -> list:
    """The traces whose prompt is neither a prefix of, equal to, nor an extension of an earlier kept trace's prompt."""
    prompts = [np.asarray(prompt).tolist() for prompt, _ in traces]
    key_len = min([KEY_LEN] + [len(p) for p in prompts])  # a prefix of a prompt must land in the prompt's group
    kept, groups = [], {}
    for tokens, (prompt, output) in zip(prompts, traces):
        group = groups.setdefault(tuple(tokens[:key_len]), [])
        if not any(_prefix(p, tokens) or _prefix(tokens, p) for p in group):
            group.append(tokens)
            kept.append((prompt, output))
    return kept
