#!/usr/bin/env python3
"""s3_setup.py — prepares moto's S3 server for tests/test_remote.c: an IAM
user with an access key (moto checks SigV4 against the keys it issued once
INITIAL_NO_AUTH_ACTION_COUNT unsigned calls are spent: these three), a
bucket, and the files of a local directory uploaded under a prefix with
that key. Prints "KEY SECRET".

usage: s3_setup.py ENDPOINT BUCKET PREFIX DIR
"""
import json
import os
import sys

import boto3

endpoint, bucket, prefix, src = sys.argv[1:5]
anon = boto3.session.Session(aws_access_key_id="setup", aws_secret_access_key="setup", region_name="us-east-1")
iam = anon.client("iam", endpoint_url=endpoint)
iam.create_user(UserName="bigbatch")
policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
iam.put_user_policy(UserName="bigbatch", PolicyName="all", PolicyDocument=json.dumps(policy))
key = iam.create_access_key(UserName="bigbatch")["AccessKey"]
s3 = boto3.session.Session(aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"],
                           region_name="us-east-1").client("s3", endpoint_url=endpoint)
s3.create_bucket(Bucket=bucket)
for d, _, files in os.walk(src):
    for f in files:
        path = os.path.join(d, f)
        s3.upload_file(path, bucket, prefix + "/" + os.path.relpath(path, src))
print(key["AccessKeyId"], key["SecretAccessKey"])
