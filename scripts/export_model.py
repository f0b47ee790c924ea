#!/usr/bin/python3
"""Export a PyTorch model for ration: writes OUT/model.pt (TorchScript) and OUT/config.toml, and with
--data also small tensor data files OUT/train.pt and OUT/test.pt (torch.save({"inputs": x, "target": y})).

Runs with Debian's python3-torch (and python3-torchvision for --torchvision); no pip needed.

  export_model.py --file my_model.py --name Net --input-shape 3,32,32 --out runs/net --data 512,256
  export_model.py --torchvision resnet18 --num-classes 10 --input-shape 3,64,64 --out runs/resnet18 --data 256,128
  export_model.py --file my_model.py --name TwoInputs --input-shape 16 --input-dtype long \\
      --input-shape 6 --input-dtype float --out runs/two --data 512,256     # forward(tokens, features)

The model is scripted with torch.jit.script (control flow and train/eval behaviour kept); --trace traces
it on an example batch instead (for code torch.jit.script rejects; tracing fixes the train/eval mode and
every branch to what the example took). Its parameter and buffer names stay the module's state_dict
names: ration's checkpoint model.pt loads back with model.load_state_dict(torch.load(path)).

The data (--data N_TRAIN,N_TEST) is a synthetic, learnable task for trying ration end to end: random
classes, float inputs = normal noise + a fixed random pattern per class (token inputs: the first token
names the class); with --loss mse / bce_with_logits the target is a fixed random projection of the input.
"""
import argparse
import ast
import importlib.util
import os
import sys

import torch


def load_factory(path, name):
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        sys.exit(f"export_model: {path} has no class or function named {name!r}")
    return getattr(module, name)


def build_model(args):
    kwargs = ast.literal_eval(args.kwargs) if args.kwargs else {}
    if args.torchvision:
        try:
            import torchvision
        except ImportError:
            sys.exit("export_model: --torchvision needs python3-torchvision (apt-get install python3-torchvision)")
        if not hasattr(torchvision.models, args.torchvision):
            sys.exit(f"export_model: torchvision.models has no model {args.torchvision!r}")
        kwargs.setdefault("num_classes", args.num_classes)
        return getattr(torchvision.models, args.torchvision)(**kwargs)
    return load_factory(args.file, args.name)(**kwargs)


def input_specs(args):
    """[(shape of one item, dtype)] for each forward input, from --input-shape / --input-dtype (given once per
    input, in forward's order; one --input-dtype applies to every input)."""
    dtypes = args.input_dtype or ["float"]
    if len(dtypes) == 1:
        dtypes = dtypes * len(args.input_shape)
    if len(dtypes) != len(args.input_shape):
        sys.exit(f"export_model: {len(args.input_shape)} --input-shape but {len(dtypes)} --input-dtype; give one "
                 "--input-dtype, or one per --input-shape")
    return [([int(s) for s in shape.split(",")], dtype) for shape, dtype in zip(args.input_shape, dtypes)]


def example_inputs(args, n):
    return tuple(torch.randint(0, args.vocab, [n] + shape) if dtype == "long" else torch.randn([n] + shape)
                 for shape, dtype in input_specs(args))


def synthetic_split(args, n, seed, teacher_seed):
    """A learnable task: classes drawn at random; float inputs are noise plus a fixed random pattern per
    class, token inputs start with a token that names the class (every input carries the class). mse
    targets: a fixed random projection of the inputs. One input is saved as "inputs": x, several as a tuple."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.Generator().manual_seed(teacher_seed)
    y = torch.randint(0, args.num_classes, (n,), generator=g)
    xs = []
    for shape, dtype in input_specs(args):
        if dtype == "long":
            x = torch.randint(0, args.vocab, [n] + shape, generator=g)
            x.view(n, -1)[:, 0] = y % args.vocab
        else:
            patterns = torch.randn([args.num_classes] + shape, generator=teacher)
            x = torch.randn([n] + shape, generator=g) + patterns[y]
        xs.append(x)
    inputs = xs[0] if len(xs) == 1 else tuple(xs)
    if args.loss != "cross_entropy" and args.loss:
        flat = torch.cat([x.float().reshape(n, -1) for x in xs], 1)
        w = torch.randn(flat.size(1), args.num_classes, generator=teacher)
        projection = flat @ w / flat.size(1) ** 0.5
        return {"inputs": inputs, "target": (projection > 0).float() if args.loss == "bce_with_logits" else projection}
    return {"inputs": inputs, "target": y}


def write_config(args, out):
    path = lambda name: os.path.abspath(os.path.join(out, name))
    lines = [
        f"# written by scripts/export_model.py ({args.torchvision or args.file + ':' + args.name})",
        "[model]",
        'type = "torchscript"',
        f'path = "{path("model.pt")}"',
    ]
    if args.loss:
        lines.append(f'loss = "{args.loss}"')
    lines += ["", "[data]", 'kind = "tensors"', f'train = "{path("train.pt")}"', f'test = "{path("test.pt")}"',
              "", "[train]", f"batch_size = {args.batch_size}", "epochs = 1", "",
              "[optim]", 'name = "adamw"', f"lr = {args.lr}", ""]
    with open(os.path.join(out, "config.toml"), "w") as f:
        f.write("\n".join(lines))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="a Python file defining the model")
    src.add_argument("--torchvision", help="a torchvision.models name (resnet18, mobilenet_v2, vgg11_bn, ...)")
    p.add_argument("--name", help="with --file: the class or factory function to call")
    p.add_argument("--kwargs", default="", help='keyword arguments for it, a Python dict literal: "{\'width\': 16}"')
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--input-shape", required=True, action="append",
                   help="one item's input shape, e.g. 3,32,32 or 16 (tokens); once per input when forward takes several")
    p.add_argument("--input-dtype", choices=["float", "long"], action="append",
                   help="float (default) or long (token ids); once for all inputs, or once per --input-shape")
    p.add_argument("--vocab", type=int, default=100, help="with --input-dtype long: token ids below this")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--loss", choices=["cross_entropy", "mse", "bce_with_logits", ""], default="cross_entropy",
                   help='applied by ration to the output; "" when forward(inputs..., target) returns the loss')
    p.add_argument("--trace", action="store_true", help="torch.jit.trace instead of torch.jit.script")
    p.add_argument("--data", default="", help="N_TRAIN,N_TEST: also write synthetic train.pt and test.pt")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.file and not args.name:
        p.error("--file needs --name")
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    model = build_model(args)
    model.train()
    if args.trace:
        scripted = torch.jit.trace(model, example_inputs(args, 2))
    else:
        scripted = torch.jit.script(model)
    scripted.save(os.path.join(args.out, "model.pt"))
    write_config(args, args.out)
    if args.data:
        n_train, n_test = (int(v) for v in args.data.split(","))
        torch.save(synthetic_split(args, n_train, args.seed + 1, args.seed), os.path.join(args.out, "train.pt"))
        torch.save(synthetic_split(args, n_test, args.seed + 2, args.seed), os.path.join(args.out, "test.pt"))
    print(f"export_model: wrote {os.path.join(args.out, 'model.pt')} and config.toml"
          + (" with train.pt, test.pt" if args.data else ""))


if __name__ == "__main__":
    main()
