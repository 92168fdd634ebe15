"""Prints, as JSON, what a deployed stack of outbox-relay is made of, as each service reports it.

  python scripts/stack-inventory.py STACK_NAME

Run with the moto venv's Python (boto3 comes with moto) by scripts/deploy-local.sh, against
AWS_ENDPOINT_URL. Only reads: the stack and its resources from CloudFormation, then each
resource from its own service (the rule and its targets, the function and its policy, the role's
policies, alarms, topic, key, queue, log group, bucket). Whether they point at each other is
test/integration/deploy-local.test.ts's to judge; here a service's refusal is recorded, not raised.
"""
import ast
import json
import sys

import boto3

stack = sys.argv[1]
cfn = boto3.client("cloudformation")


def attempt(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the refusal is data here
        return {"error": f"{type(e).__name__}: {e}"}


desc = cfn.describe_stacks(StackName=stack)["Stacks"][0]
# moto lists a resource its CloudFormation cannot create with no logical id: left out here, so the
# reader compares this list with the template's
resources = [r for r in cfn.describe_stack_resources(StackName=stack)["StackResources"] if r.get("LogicalResourceId")]
physical = {r["LogicalResourceId"]: r.get("PhysicalResourceId") for r in resources}
types = {r["LogicalResourceId"]: r["ResourceType"] for r in resources}
out = {
    "stack": {"status": desc["StackStatus"], "outputs": {o["OutputKey"]: o["OutputValue"] for o in desc.get("Outputs", [])}},
    "resources": {r["LogicalResourceId"]: {"type": r["ResourceType"], "physical": r.get("PhysicalResourceId"), "status": r["ResourceStatus"]} for r in resources},
    "services": {},
}
svc = out["services"]


def as_json(doc):
    """A policy document: JSON text as AWS returns it, or moto's forms (the object as the template gave
    it; for a role's inline policy, the object's Python repr)."""
    if not isinstance(doc, str):
        return doc
    try:
        return json.loads(doc)
    except ValueError:
        return ast.literal_eval(doc)


def of_type(t):
    return [i for i, x in types.items() if x == t]


lam, iam, events, cw = boto3.client("lambda"), boto3.client("iam"), boto3.client("events"), boto3.client("cloudwatch")
for fid in of_type("AWS::Lambda::Function"):
    name = physical[fid]
    policy = attempt(lam.get_policy, FunctionName=name)
    svc[fid] = {
        "configuration": attempt(lam.get_function_configuration, FunctionName=name),
        "policy": json.loads(policy["Policy"]) if "Policy" in policy else policy,
        "eventInvokeConfig": attempt(lam.get_function_event_invoke_config, FunctionName=name),
        "concurrency": attempt(lam.get_function_concurrency, FunctionName=name),
    }
for rid in of_type("AWS::IAM::Role"):
    name = physical[rid]
    inline = attempt(iam.list_role_policies, RoleName=name).get("PolicyNames", [])
    svc[rid] = {
        "role": attempt(iam.get_role, RoleName=name).get("Role"),
        "inline": {p: as_json(attempt(iam.get_role_policy, RoleName=name, PolicyName=p).get("PolicyDocument")) for p in inline},
        "attached": attempt(iam.list_attached_role_policies, RoleName=name).get("AttachedPolicies"),
    }
for rid in of_type("AWS::Events::Rule"):
    name = physical[rid].split("|")[0].split("/")[-1]
    svc[rid] = {"rule": attempt(events.describe_rule, Name=name), "targets": attempt(events.list_targets_by_rule, Rule=name).get("Targets")}
# by name (the template names them <stack>-…), whether or not CloudFormation lists them
found = attempt(cw.describe_alarms, AlarmNamePrefix=f"{stack}-")
svc["alarms"] = {a["AlarmName"]: a for a in found.get("MetricAlarms", []) + found.get("CompositeAlarms", [])}
for did in of_type("AWS::CloudWatch::Dashboard"):
    svc[did] = attempt(cw.get_dashboard, DashboardName=physical[did])
for tid in of_type("AWS::SNS::Topic"):
    svc[tid] = attempt(boto3.client("sns").get_topic_attributes, TopicArn=physical[tid]).get("Attributes")
for kid in of_type("AWS::KMS::Key"):
    kms = boto3.client("kms")
    # ListKeys, not DescribeKey: moto 5.2.5 answers DescribeKey with a 500 for a key whose policy came from a template
    svc[kid] = {
        "arn": next((k["KeyArn"] for k in attempt(kms.list_keys).get("Keys", []) if k["KeyId"] == physical[kid]), None),
        "policy": as_json(attempt(kms.get_key_policy, KeyId=physical[kid], PolicyName="default").get("Policy")),
        "rotation": attempt(kms.get_key_rotation_status, KeyId=physical[kid]).get("KeyRotationEnabled"),
    }
for qid in of_type("AWS::SQS::Queue"):
    svc[qid] = attempt(boto3.client("sqs").get_queue_attributes, QueueUrl=physical[qid], AttributeNames=["All"]).get("Attributes")
for gid in of_type("AWS::Logs::LogGroup"):
    groups = attempt(boto3.client("logs").describe_log_groups, logGroupNamePrefix=physical[gid]).get("logGroups", [])
    svc[gid] = next((g for g in groups if g["logGroupName"] == physical[gid]), None)
for bid in of_type("AWS::S3::Bucket"):
    s3 = boto3.client("s3")
    svc[bid] = {
        "versioning": attempt(s3.get_bucket_versioning, Bucket=physical[bid]).get("Status"),
        "publicAccessBlock": attempt(s3.get_public_access_block, Bucket=physical[bid]).get("PublicAccessBlockConfiguration"),
        "objects": [o["Key"] for o in attempt(s3.list_objects_v2, Bucket=physical[bid]).get("Contents", [])],
    }

json.dump(out, sys.stdout, indent=1, default=str)
print()
