"""The test logits processor the real vLLM of the tests loads (`--logits-processors
support.vllm_logits:ScriptedAnswers`, with tests/ on its PYTHONPATH; see tests/vllmproc.py).

For each request that joins the batch it reads the prompt (its token ids, decoded) for a script
(vllm_script.script_for) and, at every step, leaves only that script's next token possible. Test
code only: it runs inside vLLM's engine process, never in the product.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Tokenizer
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from support.vllm_script import Plan, plan, script_for


class ScriptedAnswers(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        model_config = vllm_config.model_config
        path = Path(model_config.tokenizer or model_config.model)
        self.tokenizer = Tokenizer.from_file(os.fspath(path / "tokenizer.json"))
        self.plans: dict[str, Plan] = {}  # by script name; the scripts are fixed
        self.rows: dict[int, tuple[Plan, list[int]]] = {}  # batch row -> (plan, its output ids so far)

    def is_argmax_invariant(self) -> bool:
        return False  # it decides the argmax

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def _plan_for(self, prompt_ids: list[int] | None) -> Plan | None:
        if prompt_ids is None:
            return None
        script = script_for(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        if script is None:
            return None
        key = repr(script)
        if key not in self.plans:
            self.plans[key] = plan(script, self._encode)
        return self.plans[key]

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
        for index, _params, prompt_ids, output_ids in batch_update.added:
            p = self._plan_for(prompt_ids)
            if p is None:
                self.rows.pop(index, None)
            else:
                self.rows[index] = (p, output_ids)
        for a, b, how in batch_update.moved:
            ra, rb = self.rows.pop(a, None), self.rows.pop(b, None)
            if ra is not None:
                self.rows[b] = ra
            if how == MoveDirectionality.SWAP and rb is not None:
                self.rows[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows:
            return logits
        rows = [r for r in self.rows if r < logits.shape[0]]
        if not rows:
            return logits
        toks = [self.rows[r][0].at(len(self.rows[r][1])) for r in rows]
        idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
        logits[idx] = float("-inf")
        logits[idx, torch.tensor(toks, dtype=torch.long, device=logits.device)] = 0.0
        return logits
