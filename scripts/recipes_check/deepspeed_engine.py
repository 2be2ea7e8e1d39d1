"""DeepSpeed's own engine trains with a merged config (recipes-check.sh, stage deepspeed).

Run under torchrun (gloo, CPU): python -m torch.distributed.run --nproc-per-node W deepspeed_engine.py CONFIG
deepspeed.initialize() reads CONFIG (its DeepSpeedConfig asserts train_batch_size = micro ×
accumulation × world size), then the engine runs 2 optimizer steps of micro-batches; rank 0 prints
one line with what the engine used and the samples it saw per optimizer step, summed over ranks.
The model is small: what is checked is the batch arithmetic, not memory.
"""
import sys

import deepspeed
import deepspeed.ops
import torch
import torch.distributed as dist

# DeepSpeed's CPU accelerator JIT-builds a shared-memory allreduce op (ninja, a C++ compiler, about a
# minute) when it sets up communication; gloo does not need it.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
deepspeed.init_distributed(dist_backend="gloo")

model = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10))
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=sys.argv[1])
micro = engine.train_micro_batch_size_per_gpu()
accum = engine.gradient_accumulation_steps()
steps = 2
samples = 0
for _ in range(steps * accum):
    x, y = torch.randn(micro, 64), torch.randint(10, (micro,))
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()  # an optimizer step at each accumulation boundary
    samples += micro
total = torch.tensor([samples])
dist.all_reduce(total)
if engine.global_rank == 0:
    print(
        f"deepspeed-engine: deepspeed={deepspeed.__version__} world_size={engine.world_size} "
        f"train_batch_size={engine.train_batch_size()} micro_batch={micro} accumulation={accum} "
        f"optimizer_steps={engine.global_steps} samples_per_step={total.item() // max(engine.global_steps, 1)}",
        flush=True,
    )
# Tear the process group down before the interpreter exits: gloo's threads still running at exit
# made a rank abort now and then ("terminate called without an active exception", SIGABRT) after
# the result line was printed (the full test suite, 2026-12-03 10:23).
dist.barrier()
dist.destroy_process_group()
