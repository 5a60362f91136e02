"""L2: scheduler steps (FlowMatchEulerDiscreteScheduler as Flux runs it, UniPCMultistepScheduler as Wan runs it)
fed a bfloat16 model output against the same steps fed the float32 model output.

Both sides get fresh schedulers with one config, the same initial latent and the same sequence of 4 model outputs
(made once in float32; the feature side receives each rounded to bf16, as a bf16 DiT emits it). The emitted tensor
is the stack of the 4 ``prev_sample`` latents, so the multistep state (UniPC's history of converted model outputs)
is covered. Note FlowMatchEuler returns ``prev_sample`` in the model output's dtype (bf16 latents), UniPC in the
sample's (fp32): both are the libraries' behaviour under test.

T2: bf16 rounding of the model output is lossy by definition; bars from ``test_scheduler_step.vgct-evidence.json``
with the per-channel mean shift over the latent channels (dim 2 of the stack).
"""

from __future__ import annotations

import pytest
import torch

import _components as C
from vgct_ext.probes import expect_gate_failure
from vgct_ext.skips import requires_gpu

pytestmark = [pytest.mark.feature("bf16 model output")]

STEPS, NUM_INFERENCE_STEPS = 4, 10
FM, UNIPC = "scheduler.flow_match_euler.step", "scheduler.unipc_multistep.step"


def make_scheduler(name):
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    if name == FM:
        s = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    else:
        s = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                    num_train_timesteps=1000, flow_shift=3.0)
    s.set_timesteps(NUM_INFERENCE_STEPS)
    return s


def run_steps(name, device="cpu", *, seed=0, fault=None):
    """(stacked prev_samples with bf16 model outputs, the same with fp32 model outputs, dtype fed on the
    feature side); latent, noise and model outputs drawn from ``seed`` (``vgct.seed``). ``fault="off_by_one"``: the feature side's scheduler starts at step index 1 (one sigma
    ahead), a state bug in that path."""
    dev = C.device_for(device)
    s = 1000 * seed
    x0 = C.randn(C.WAN_LATENT, seed=s + 5, device=dev)
    noise = C.randn(C.WAN_LATENT, seed=s + 6, device=dev)
    # a plausible flow-matching velocity sequence: (noise - x0) plus a step-dependent model error
    outputs = [noise - x0 + 0.1 * C.randn(C.WAN_LATENT, seed=s + 100 + i, device=dev) for i in range(STEPS)]
    ref, feat = make_scheduler(name), make_scheduler(name)
    if fault == "off_by_one":
        feat.set_begin_index(1)
    xr, xf = noise.clone(), noise.clone()
    ref_out, feat_out, fed = [], [], set()
    for i, t in enumerate(ref.timesteps[:STEPS]):
        xr = ref.step(outputs[i], t, xr, return_dict=False)[0]
        mo = outputs[i].to(torch.bfloat16)
        fed.add(mo.dtype)
        xf = feat.step(mo, t, xf, return_dict=False)[0]
        ref_out.append(xr)
        feat_out.append(xf)
    return torch.stack(feat_out), torch.stack(ref_out), fed


GPU = [pytest.mark.gpu, requires_gpu()]


@pytest.mark.t2
@pytest.mark.parametrize("device", [pytest.param("cpu"), pytest.param("cuda", marks=GPU)])
@pytest.mark.parametrize("name", [pytest.param(FM, id="flow_match_euler", marks=pytest.mark.component(FM)),
                                  pytest.param(UNIPC, id="unipc", marks=pytest.mark.component(UNIPC))])
def test_scheduler_step_bf16_model_output(vgct, name, device):
    """L2. Boundary: 4 consecutive scheduler.step calls -> stacked prev_sample (4, 1, 8, 3, 8, 8) on a Wan-shaped
    latent (flow matching, shift 3, 10 inference steps). Feature: the model output arrives in bfloat16. Reference:
    the same steps with the float32 model output, fresh schedulers of one config, same latent and outputs. T2,
    calibrated evidence, per-channel mean shift over the latent channels (dim 2)."""
    actual, expected, fed = run_steps(name, device, seed=vgct.seed)
    vgct.assert_feature_active(flag=fed == {torch.bfloat16}, on=actual, off=expected)
    vgct.assert_t2(actual, expected, dim=2)


@pytest.mark.parametrize("name", [pytest.param(FM, id="flow_match_euler", marks=pytest.mark.component(FM)),
                                  pytest.param(UNIPC, id="unipc", marks=pytest.mark.component(UNIPC))])
def test_planted_fault_step_index_off_by_one_is_caught(vgct, name):
    """Planted fault: the feature side's scheduler runs one sigma ahead (step index off by one). The T2 gate must
    fail, naming the component and the moved statistics."""
    C.skip_while_calibrating(vgct)
    actual, expected, _ = run_steps(name, fault="off_by_one")
    with expect_gate_failure(any_of=("rel_l2", "cosine", "p99", "max_abs_err", "channel_mean_shift"), component=name):
        vgct.assert_t2(actual, expected, dim=2)  # (a planted fault reads the clean test's evidence only in this block)
