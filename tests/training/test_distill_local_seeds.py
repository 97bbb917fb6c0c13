"""In-process distillation samples each batch from a seed of its own (the run's seed and the batch's first row):
a batch's rows do not depend on what the process did before it (a teacher's training, earlier batches), so teachers
of different arms explain with the same random numbers and a restart at a batch boundary writes the same rows.
Before, the stage sampled from whatever state the global generator was left in."""

import torch
from suite_helpers import tiny_doc

from rlt.spec.loading import parse_run
from rlt.stages.distill import local_batches


def batches(model, tok, seed, share, prompts, noise):
    doc = tiny_doc()
    doc["spec"]["seed"] = seed
    doc["spec"]["stages"]["distill"].update(batchSize=2, samplesPerQuestion=2, temperature=1.0, maxNewTokens=8)
    spec = parse_run(doc).spec
    torch.manual_seed(noise)  # whatever ran before in the process
    pairs = [share[s : s + 2] for s in range(0, len(share), 2)]  # batches of batchSize
    return [s.completion_ids for _, s in local_batches(spec, model, tok, prompts, pairs)]


def test_batches_depend_on_the_seed_and_rows_only(tiny):
    model, tok = tiny
    prompts = {i: tok(f"Question {i}: what is {i} + {i}?").input_ids for i in range(6)}
    share = [(i, {"question": f"q{i}"}) for i in range(6)]
    first = batches(model, tok, 3, share, prompts, noise=1)
    assert first == batches(model, tok, 3, share, prompts, noise=2)  # the process's history does not matter
    assert batches(model, tok, 3, share[2:], prompts, noise=5) == first[1:]  # resumed at a batch boundary
    assert batches(model, tok, 4, share, prompts, noise=1) != first  # the run's seed does
