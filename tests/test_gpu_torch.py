"""GPU tier: CUDA torch tensors in and out of hopmm's public functions (zero-copy through
DLPack, on the current torch stream). Skips without a Hopper GPU or without CUDA torch."""
import pytest

from conftest import requires_hopper
from forced import TOL

torch = pytest.importorskip("torch")

pytestmark = [requires_hopper,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="torch has no CUDA")]

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# GPU cycles torch.cuda._sleep spins for: about 25 ms on an H100, long enough that work
# queued behind it on the same stream has certainly not run when the host looks.
SLEEP_CYCLES = 50_000_000


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """Every call here must run on hopmm's kernels."""
    monkeypatch.setenv("HOPMM_STRICT", "1")


def rand(shape, dtype):
    return torch.randn(shape, device="cuda", dtype=torch.float32).to(DTYPES[dtype])


def check(got, a, b, dtype):
    """got is a CUDA torch tensor of a's dtype, equal to a @ b in fp32 within TOL."""
    assert isinstance(got, torch.Tensor) and got.is_cuda and got.dtype == DTYPES[dtype]
    ref = torch.matmul(a.float(), b.float())
    assert got.shape == ref.shape
    assert not torch.isnan(got).any(), "unwritten (NaN-poisoned) or NaN output elements"
    err = torch.linalg.norm(got.float() - ref) / max(float(torch.linalg.norm(ref)), 1e-30)
    assert float(err) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(256, 512, 320), (1000, 1023, 17), (1, 260, 200)])
def test_torch_in_torch_out(m, n, k, dtype):
    import hopmm

    a, b = rand((m, k), dtype), rand((k, n), dtype)
    got = hopmm.matmul(a, b)
    check(got, a, b, dtype)
    check(hopmm.matmul(a, b), a, b, dtype)   # a repeat (the remembered launches)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta,tb", [(True, False), (False, True), (True, True)],
                         ids=["TN", "NT", "TT"])
def test_transposed_views(ta, tb, dtype):
    import hopmm

    a = rand((300, 200), dtype).t() if ta else rand((200, 300), dtype)
    b = rand((260, 300), dtype).t() if tb else rand((300, 260), dtype)
    check(hopmm.matmul(a, b), a, b, dtype)
    assert "path: kernel" in hopmm.explain(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sliced_views_and_offsets(dtype):
    import hopmm

    big = rand((520, 700), dtype)
    a = big[8:264, 16:336]           # an offset, rows of a wider pitch
    b = rand((640, 300), dtype)[::2, 1:]   # every other row, misaligned start
    check(hopmm.matmul(a, b), a, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batches_and_broadcast(dtype):
    import hopmm

    a = rand((3, 2, 130, 70), dtype)
    b = rand((2, 70, 90), dtype)
    check(hopmm.matmul(a, b), a, b, dtype)
    v = rand((70,), dtype)
    check(hopmm.matmul(a, v), a, v, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_tensor_written_in_place_and_returned(dtype):
    import hopmm

    a, b = rand((200, 128), dtype), rand((128, 136), dtype)
    out = torch.full((200, 136), float("nan"), device="cuda", dtype=DTYPES[dtype])
    assert hopmm.matmul(a, b, out=out) is out
    check(out, a, b, dtype)
    strided = torch.full((200, 272), float("nan"), device="cuda", dtype=DTYPES[dtype])[:, ::2]
    assert hopmm.matmul(a, b, out=strided) is strided
    check(strided, a, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_runs_on_the_current_torch_stream(dtype):
    """Queued on a non-default torch stream behind a long sleep and a write of A: a kernel
    on any other stream would read A before that write (torch's streams do not wait for the
    legacy default stream), and nothing has run before the stream is synchronised. Both the
    full path and the repeat of remembered launches are checked."""
    import hopmm
    from hopmm import fastpath

    a, b = rand((256, 192), dtype), rand((192, 128), dtype)
    fresh_a = rand((256, 192), dtype)
    out = torch.full((256, 128), float("nan"), device="cuda", dtype=DTYPES[dtype])
    hopmm.matmul(a, b)             # compiles and loads the kernel before any timing matters
    hopmm.matmul(a, b, out=out)
    stream = torch.cuda.Stream()
    for full_path in (True, False):
        expected_a = fresh_a if full_path else -fresh_a
        out.fill_(float("nan"))
        torch.cuda.synchronize()   # all of that done before the stream's work is queued
        if full_path:
            fastpath.clear()       # forget the launches (the loaded kernel stays loaded)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(SLEEP_CYCLES)
            a.copy_(expected_a)
            got = hopmm.matmul(a, b)
            hopmm.matmul(a, b, out=out)
        assert not stream.query(), "the sleep ended before the host got here"
        stream.synchronize()
        check(got, expected_a, b, dtype)
        check(out, expected_a, b, dtype)


def test_bfloat16_keeps_its_dtype_both_ways():
    import cupy

    from hopmm import interop

    t = rand((4, 8), "bfloat16")
    x = interop.tensor_to_cupy(t, torch, cupy)
    assert x.dtype.name == "bfloat16" and x.data.ptr == t.data_ptr()
    back = interop.cupy_to_tensor(x, torch, cupy)
    assert back.dtype == torch.bfloat16 and back.data_ptr() == t.data_ptr()
    assert x.T.strides == (2, 16) and interop.tensor_to_cupy(t.t(), torch, cupy).strides == (2, 16)
    view = rand((6, 10), "float16")[2:, 1::2]   # an offset and a column step stay a view
    y = interop.tensor_to_cupy(view, torch, cupy)
    assert y.data.ptr == view.data_ptr() and y.strides == (20, 4) and y.shape == (4, 5)


def test_explain_and_plan_take_tensors():
    import hopmm

    a, b = rand((512, 256), "bfloat16"), rand((256, 384), "bfloat16")
    text = hopmm.explain(a, b)
    assert "path: kernel" in text and "schedule:" in text
    p = hopmm.plan(a, b)
    assert p.path == "kernel" and p.shapes.out_shape == (512, 384)


def test_grad_rules_on_cuda():
    import hopmm

    a = rand((64, 64), "float16").requires_grad_()
    b = rand((64, 64), "float16")
    with pytest.raises(ValueError, match="a requires grad"):
        hopmm.matmul(a, b)
    with torch.no_grad():
        got = hopmm.matmul(a, b)
    assert not got.requires_grad
    check(got, a.detach(), b, "float16")


def test_cpu_and_cuda_tensors_mixed_are_refused():
    import hopmm

    with pytest.raises(TypeError, match="b is a torch tensor on cpu"):
        hopmm.matmul(rand((8, 8), "float16"), torch.ones(8, 8, dtype=torch.float16))


def test_mixed_torch_and_cupy_is_refused():
    import cupy

    import hopmm

    with pytest.raises(TypeError, match="mixed torch and cupy"):
        hopmm.matmul(rand((8, 8), "float16"), cupy.ones((8, 8), cupy.float16))


def test_empty_and_zero_k_results_are_tensors():
    import hopmm

    got = hopmm.matmul(rand((0, 8), "float16"), rand((8, 5), "float16"))
    assert isinstance(got, torch.Tensor) and got.shape == (0, 5)
    zeros = hopmm.matmul(rand((3, 0), "float16"), rand((0, 5), "float16"))
    assert isinstance(zeros, torch.Tensor) and bool((zeros == 0).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_repeats_launch_without_dlpack(dtype, monkeypatch):
    """A repeat of a call that read and wrote in place runs its remembered launches straight
    from the tensors' pointers (no conversion); with new values each time, and with out=."""
    import hopmm
    from hopmm import interop

    a, b = rand((384, 256), dtype), rand((256, 320), dtype)
    out = torch.empty((384, 320), device="cuda", dtype=DTYPES[dtype])
    check(hopmm.matmul(a, b), a, b, dtype)
    check(hopmm.matmul(a, b, out=out), a, b, dtype)

    def no_conversion(*args, **kwargs):
        raise AssertionError("a repeat went through DLPack")

    monkeypatch.setattr(interop, "call_with_tensors", no_conversion)
    for _ in range(3):
        a.copy_(rand((384, 256), dtype))
        check(hopmm.matmul(a, b), a, b, dtype)
        out.fill_(float("nan"))
        assert hopmm.matmul(a, b, out=out) is out
        check(out, a, b, dtype)


@pytest.mark.parametrize("a_shape,b_shape", [((256,), (256, 320)), ((384, 256), (256,)),
                                              ((256,), (256,)), ((2, 64, 256), (256, 320))])
def test_repeats_keep_vector_and_batch_shapes(a_shape, b_shape):
    """A repeat makes its new result of the recipe's shape (the sizes one by one, or none for
    a vector times a vector), with new operand values each time."""
    import hopmm

    a, b = rand(a_shape, "bfloat16"), rand(b_shape, "bfloat16")
    for _ in range(3):
        a.copy_(rand(a_shape, "bfloat16"))
        got = hopmm.matmul(a, b)
        assert isinstance(got, torch.Tensor) and got.shape == torch.matmul(a, b).shape
        check(got, a, b, "bfloat16")


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_repeats_launch_without_dlpack_on_a_side_stream(dtype, monkeypatch):
    """A repeat of a fused call that read and wrote in place runs its remembered launches
    straight from the tensors' pointers, bias and c included, on the current torch stream:
    new bias values each time, and a residual added in place (out = c)."""
    import hopmm
    from hopmm import interop

    a, b = rand((384, 256), dtype), rand((256, 320), dtype)
    bias, r = rand((320,), dtype), rand((384, 320), dtype)
    stream = torch.cuda.Stream()

    def expected_relu():
        return torch.relu(torch.matmul(a.float(), b.float()) + bias.float())

    def close(got, ref):
        assert isinstance(got, torch.Tensor) and not torch.isnan(got).any()
        err = torch.linalg.norm(got.float() - ref) / torch.linalg.norm(ref)
        assert float(err) < TOL[dtype]

    with torch.cuda.stream(stream):
        close(hopmm.matmul(a, b, bias=bias, activation="relu"), expected_relu())
        ref = torch.matmul(a.float(), b.float()) + r.float()
        assert hopmm.matmul(a, b, c=r, beta=1.0, out=r) is r
        close(r, ref)

        def no_conversion(*args, **kwargs):
            raise AssertionError("a repeat went through DLPack")

        monkeypatch.setattr(interop, "call_with_tensors", no_conversion)
        for _ in range(3):
            bias.copy_(rand((320,), dtype))
            close(hopmm.matmul(a, b, bias=bias, activation="relu"), expected_relu())
            ref = torch.matmul(a.float(), b.float()) + r.float()
            assert hopmm.matmul(a, b, c=r, beta=1.0, out=r) is r
            close(r, ref)
    stream.synchronize()


@pytest.mark.parametrize("inference", ["no_grad", "inference_mode"])
def test_parameters_repeat_without_dlpack_under_no_grad(inference, monkeypatch):
    """Parameters require grad: a weight passed as B and nn.Linear's bias, read under no_grad
    or inference_mode, repeat through their pointers (no conversion) with the right results;
    with grad on they are refused, remembered launches or not."""
    import hopmm
    from hopmm import interop

    w = torch.nn.Parameter(rand((256, 320), "bfloat16"))
    bias = torch.nn.Linear(256, 320, device="cuda", dtype=torch.bfloat16).bias
    mode = torch.no_grad if inference == "no_grad" else torch.inference_mode

    def expected(x):
        return torch.relu(x.float() @ w.detach().float() + bias.detach().float())

    def close(got, ref):
        assert isinstance(got, torch.Tensor) and not got.requires_grad
        assert not torch.isnan(got).any()
        err = torch.linalg.norm(got.float() - ref) / torch.linalg.norm(ref)
        assert float(err) < TOL["bfloat16"]

    def no_conversion(*args, **kwargs):
        raise AssertionError("a repeat went through DLPack")

    converting = interop.call_with_tensors
    with mode():
        x = rand((384, 256), "bfloat16")
        check(hopmm.matmul(x, w), x, w.detach(), "bfloat16")
        close(hopmm.matmul(x, w, bias=bias, activation="relu"), expected(x))
        monkeypatch.setattr(interop, "call_with_tensors", no_conversion)
        for _ in range(3):
            x = rand((384, 256), "bfloat16")
            check(hopmm.matmul(x, w), x, w.detach(), "bfloat16")
            close(hopmm.matmul(x, w, bias=bias, activation="relu"), expected(x))
    monkeypatch.setattr(interop, "call_with_tensors", converting)
    with pytest.raises(ValueError, match="b requires grad"):
        hopmm.matmul(x, w)
    with pytest.raises(ValueError, match="bias requires grad"):
        hopmm.matmul(x, w.detach(), bias=bias, activation="relu")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k", [(16, 2048, 1024), (1, 4096, 1000)])
def test_one_kernel_repeats_launch_without_dlpack_on_a_side_stream(m, n, k, dtype,
                                                                   monkeypatch):
    """swiglu and matmul_shared_a of decode rows with torch operands (the one kernel): a
    repeat launches the remembered launches straight from the tensors' pointers on the
    current torch stream, new activations each call, weights as `w.T`."""
    import hopmm
    from hopmm import interop

    wg, wu = rand((n, k), dtype) * k ** -0.5, rand((n, k), dtype) * k ** -0.5
    g, u = wg.T, wu.T   # nn.Linear's weights: K-major Bs
    stream = torch.cuda.Stream()

    def close(got, ref):
        assert isinstance(got, torch.Tensor) and got.dtype == DTYPES[dtype]
        assert not torch.isnan(got).any()
        err = torch.linalg.norm(got.float() - ref) / torch.linalg.norm(ref)
        assert float(err) < TOL[dtype]

    def run_and_check(a):
        gate, up = torch.matmul(a.float(), g.float()), torch.matmul(a.float(), u.float())
        close(hopmm.swiglu(a, g, u), torch.nn.functional.silu(gate) * up)
        y0, y1 = hopmm.matmul_shared_a(a, [g, u])
        close(y0, gate)
        close(y1, up)

    with torch.cuda.stream(stream):
        run_and_check(rand((m, k), dtype))

        def no_conversion(*args, **kwargs):
            raise AssertionError("a repeat went through DLPack")

        monkeypatch.setattr(interop, "call_with_tensors", no_conversion)
        for _ in range(3):
            run_and_check(rand((m, k), dtype))
    stream.synchronize()
