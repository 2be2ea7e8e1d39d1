#!/usr/bin/env python3
"""A tiny GPT-2 (``GPT2Config(n_layer=2, n_embd=128, n_head=2)``, its own small vocabulary) trained on
random tokens by the Hugging Face ``transformers.Trainer`` on CPU: the script a Trainer user has, with
its ``--batch-size`` mapped to ``per_device_train_batch_size``. Needs transformers (the benchmark venv);
reports to batchfit through ``batchfit_trial.BatchfitTrainerCallback`` (batchfit_trial.py on PYTHONPATH).

    python train_hf.py --batch-size 8 --steps 100 --accumulation 2
    batchfit probe --exec -- python train_hf.py --batch-size {batch} --steps {steps} --accumulation {accumulation}

``make_trainer(args, batch, steps, accumulation, **training_args)`` builds the model and the Trainer, so
that the Trainer's own finder (``TrainingArguments(auto_find_batch_size=True)``) can be run on the same
script (benches/exec_peers/peer.py does).
"""
import argparse
import os
import sys
import tempfile

import batchfit_trial as bt
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(Dataset):
    def __init__(self, n, seq, vocab, seed):
        self.n, self.seq, self.vocab, self.seed = n, seq, vocab, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.randint(0, self.vocab, (self.seq,), generator=torch.Generator().manual_seed(self.seed + i))
        return {"input_ids": ids, "labels": ids}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--accumulation", type=int, default=None)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def make_trainer(args, batch, steps, accumulation, output_dir, **training_args):
    torch.manual_seed(args.seed)
    cfg = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads, vocab_size=args.vocab,
                     n_positions=args.seq)
    model = GPT2LMHeadModel(cfg)
    targs = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=batch, max_steps=steps,
                              gradient_accumulation_steps=accumulation, use_cpu=True, report_to="none",
                              save_strategy="no", logging_strategy="no", disable_tqdm=True,
                              dataloader_num_workers=0, seed=args.seed, **training_args)
    data = RandomTokens(max(batch, 1) * max(steps, 1) * max(accumulation, 1) * 4, args.seq, args.vocab, args.seed)
    return Trainer(model=model, args=targs, train_dataset=data, callbacks=[bt.BatchfitTrainerCallback()])


def main():
    args = parse_args()
    batch = args.batch_size if args.batch_size is not None else bt.batch_size(default=8)
    steps = args.steps if args.steps is not None else bt.steps(default=100)
    accumulation = args.accumulation if args.accumulation is not None else bt.accumulation(default=1)
    if min(batch, steps, accumulation) < 1:
        sys.exit(f"train_hf.py: batch {batch}, steps {steps}, accumulation {accumulation} must be >= 1")
    with tempfile.TemporaryDirectory(prefix="train-hf-") as out:
        trainer = make_trainer(args, batch, steps, accumulation, out)
        trainer.train()
    print(f"train_hf: trained batch {batch} x accumulation {accumulation} for {trainer.state.global_step} steps",
          flush=True)


if __name__ == "__main__":
    main()
