import pytest
import torch

from infra.weights.buckets import bucket_params, dtype_name


def test_order_preserved_and_limits_respected():
    sizes = [("a", 4), ("b", 4), ("c", 4), ("d", 2), ("e", 6)]
    assert bucket_params(sizes, 8) == [["a", "b"], ["c", "d"], ["e"]]


def test_oversized_tensor_goes_alone():
    sizes = [("a", 2), ("big", 100), ("b", 2), ("c", 2)]
    assert bucket_params(sizes, 8) == [["a"], ["big"], ["b", "c"]]


def test_everything_fits_in_one_bucket():
    assert bucket_params([("a", 1), ("b", 1)], 1 << 20) == [["a", "b"]]
    assert bucket_params([], 10) == []


def test_exact_fit_and_invalid_size():
    assert bucket_params([("a", 5), ("b", 5), ("c", 1)], 10) == [["a", "b"], ["c"]]
    with pytest.raises(ValueError):
        bucket_params([("a", 1)], 0)


def test_dtype_name():
    assert dtype_name(torch.float32) == "float32"
    assert dtype_name(torch.bfloat16) == "bfloat16"
    assert getattr(torch, dtype_name(torch.float16)) is torch.float16
