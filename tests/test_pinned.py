"""The host/device double buffer behind every per-step upload (utils/pinned.py), on CPU."""
import torch

from nanovllm.utils.pinned import PinnedDoubleBuffer


def test_two_host_sets_alternate_and_upload_copies_the_width_asked():
    staging = PinnedDoubleBuffer([(6, torch.int64), (4, torch.int32)], "cpu")
    first, second = staging.next_host(), staging.next_host()
    assert first[0].data_ptr() != second[0].data_ptr() and staging.next_host()[0].data_ptr() == first[0].data_ptr()
    first[0][:] = torch.arange(6)
    first[1][:] = 7
    staging.upload(first, [None, 2])
    assert staging.devices[0].tolist() == list(range(6)) and staging.devices[1].tolist() == [7, 7, 0, 0]


def test_a_host_only_buffer_has_no_device_side():
    staging = PinnedDoubleBuffer([(3, torch.int64)])
    assert staging.devices == [] and staging.turn == 0
    staging.next_host()
    assert staging.turn == 1
