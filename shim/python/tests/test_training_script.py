"""A training script written the way public ModelArts scripts are, run unchanged against moto."""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import argparse
    import os

    import moxing as mox
    import torch

    mox.file.shift('os', 'mox')

    parser = argparse.ArgumentParser()
    parser.add_argument('--data_url', required=True)
    parser.add_argument('--train_url', required=True)
    parser.add_argument('--local_data', required=True)
    args, _ = parser.parse_known_args()


    def sync_data(from_path, to_path):
        mox.file.copy_parallel(src_url=from_path, dst_url=to_path, threads=0, is_processing=False)


    sync_data(args.data_url, args.local_data)
    images = sorted(os.listdir(os.path.join(args.local_data, 'images')))
    assert images == ['0.bin', '1.bin', '2.bin'], images
    with open(os.path.join(args.data_url, 'labels.txt')) as f:
        labels = [int(line) for line in f]
    assert labels == [0, 1, 0], labels
    assert os.path.exists(args.data_url + '/labels.txt') and os.path.isdir(args.data_url + '/images')

    model = torch.nn.Linear(4, 2)
    os.makedirs(args.train_url, exist_ok=True)
    with mox.file.File(os.path.join(args.train_url, 'model.pth'), 'wb') as f:
        torch.save(model.state_dict(), f)
    with open(os.path.join(args.train_url, 'model.pth'), 'rb') as f:
        loaded = torch.load(f)
    assert torch.equal(loaded['weight'], model.weight.detach())
    print('saved', sorted(os.listdir(args.train_url)))
    mox.file.remove(args.data_url + '/tmp', recursive=True)
    """
)


def test_a_public_style_training_script_runs_unchanged(s3, bucket, tmp_path):
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"data/images/{i}.bin", Body=bytes([i]) * 100)
    s3.put_object(Bucket=bucket, Key="data/labels.txt", Body=b"0\n1\n0\n")
    s3.put_object(Bucket=bucket, Key="data/tmp/scratch", Body=b"x")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [
            sys.executable,
            str(script),
            f"--data_url=obs://{bucket}/data",
            f"--train_url=obs://{bucket}/output",
            f"--local_data={tmp_path / 'cache' / 'data'}",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "saved ['model.pth']" in out.stdout
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["data/images/0.bin", "data/images/1.bin", "data/images/2.bin", "data/labels.txt", "output/model.pth"]
