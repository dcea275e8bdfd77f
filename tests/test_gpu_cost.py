"""The launch and sync counter (benchmarks/devtools/gpu_cost.py): it must see what a GPU pays, and change nothing."""

import torch

from benchmarks.devtools import gpu_cost


def test_counts_a_launch_per_computing_op_and_none_for_views():
    x = torch.arange(12.0).reshape(3, 4)
    with gpu_cost.counting() as c:
        d = gpu_cost.to_device(x)
        y = (d + 1).view(12)
        z = y * 2
    assert c.launch_count() == 2  # add, mul; the view costs no kernel
    assert c.sync_count() == 0
    assert torch.equal(gpu_cost.held(z), (x + 1).view(12) * 2)


def test_every_kind_of_sync_is_counted_with_its_line():
    x = torch.arange(12.0).reshape(3, 4)
    with gpu_cost.counting() as c:
        d = gpu_cost.to_device(x)
        value = d.sum().item()
        nz = torch.nonzero(d > 3)
        masked = d[d > 5]
        host = d.cpu()
        created = torch.tensor([1, 2, 3], device=gpu_cost.DEVICE)
        blocking = torch.ones(3).to(gpu_cost.DEVICE)
        asynchronous = torch.ones(3).to(gpu_cost.DEVICE, non_blocking=True)
    kinds = {kind for kind, _, _, _ in c.sync_sites()}
    assert kinds == {"value read by the host", "output size depends on the data", "boolean-mask index (nonzero)",
                     "blocking copy to the host", "blocking copy of host data to the device",
                     "blocking copy to the device"}
    assert c.sync_count() == 6  # the non-blocking copy is not one
    assert all(site.startswith("tests/test_gpu_cost.py:") for _, _, site, _ in c.sync_sites())
    assert value == x.sum().item() and len(gpu_cost.held(nz)) == 8 and len(gpu_cost.held(masked)) == 6
    assert type(host) is torch.Tensor and isinstance(created, gpu_cost.OnDevice)
    assert isinstance(blocking, gpu_cost.OnDevice) and isinstance(asynchronous, gpu_cost.OnDevice)


def test_syncs_inside_an_op_and_host_reads_are_counted_and_pageable_copies_flagged():
    """What no dispatch-level data dependency shows: ops whose host code reads a device value (repeat_interleave
    without output_size, multinomial of one sample or without replacement), ``.tolist()``/``.numpy()`` (counted
    with their line, the values returned), and a non-blocking copy from pageable memory (flagged, not a sync)."""
    x = torch.arange(1.0, 5.0)
    with gpu_cost.counting() as c:
        d = gpu_cost.to_device(x)
        repeats = gpu_cost.to_device(torch.tensor([1, 2, 1, 1]))
        torch.repeat_interleave(d, repeats)  # sync
        torch.repeat_interleave(d, repeats, output_size=5)  # none
        torch.multinomial(d, 1)  # sync
        torch.multinomial(d, 2, replacement=True)  # none
        values, array = d.tolist(), d.numpy()
        torch.ones(3).to(gpu_cost.DEVICE, non_blocking=True)
    ops = sorted(op for _, op, _, _ in c.sync_sites())
    assert ops == ["multinomial", "numpy", "repeat_interleave", "tolist"], c.sync_sites()
    assert values == x.tolist() and array.tolist() == x.tolist()
    assert [n for _, n in c.pageable_sites()] == [1] and c.pageable_sites()[0][0].startswith("tests/test_gpu_cost.py:")


def test_a_synthetic_item_in_a_training_step_is_caught():
    """What the zero-sync tests rely on: a step that reads its loss every iteration shows one sync per step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with gpu_cost.counting() as c:
        model.to(gpu_cost.DEVICE)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
        x, y = gpu_cost.to_device(torch.randn(5, 4)), gpu_cost.to_device(torch.tensor([0, 1, 2, 0, 1]))
        c.launches.clear(), c.syncs.clear()
        with c.phase("step"):
            for _ in range(3):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                logged = loss.item()  # the synthetic sync
    assert c.sync_count("step") == 3
    assert c.sync_sites("step")[0][2].endswith(f":{logged_line()}")
    assert isinstance(model[0].weight, gpu_cost.OnDevice) and isinstance(model[0].weight.grad, gpu_cost.OnDevice)
    assert c.launch_count("step") > 3 * 6  # forward, loss, backward and the update all launch
    assert logged == logged  # a real float came back


def logged_line() -> int:
    import inspect

    source, start = inspect.getsourcelines(test_a_synthetic_item_in_a_training_step_is_caught)
    return start + next(i for i, line in enumerate(source) if "the synthetic sync" in line)


def test_results_equal_the_cpu_bit_for_bit_through_backward():
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    reference = conv(x).relu().mean()
    reference.backward()
    grad = conv.weight.grad.clone()
    conv.zero_grad(set_to_none=True)
    with gpu_cost.counting():
        conv.to(gpu_cost.DEVICE)
        out = conv(gpu_cost.to_device(x)).relu().mean()
        out.backward()
        assert torch.equal(gpu_cost.held(out), reference.detach())
        assert torch.equal(gpu_cost.held(conv.weight.grad), grad)


def test_a_host_tensor_mixed_into_a_device_op_is_a_mixup():
    with gpu_cost.counting() as c:
        d = gpu_cost.to_device(torch.ones(3))
        d + torch.ones(3)  # a RuntimeError on real CUDA
        d + torch.tensor(2.0)  # a host scalar tensor is allowed
    assert sum(c.mixups.values()) == 1


def _loop_five_times() -> int:
    total = 0
    for i in range(5):
        total += i
    return total


def test_loop_counter_counts_iterations_of_the_code_it_watches():
    with gpu_cost.LoopCounter(roots=("tests",)) as loops:
        _loop_five_times()
    assert loops.total() == 5
    with gpu_cost.LoopCounter() as outside:  # ltbench/ and methods/ only: this file's loop is not theirs
        _loop_five_times()
    assert outside.total() == 0
