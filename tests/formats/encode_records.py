"""Writes test records as producers in the field write them: Confluent's own
serializers (PyPI confluent-kafka), registering the schema in the registry
under the topic's subject (TopicNameStrategy) as they do.

Reads one JSON object per line on stdin, writes the encoded bytes of each as
one hex line on stdout.

  encode_records.py --registry URL --topic T --format avro|protobuf|json_schema
                    --schema FILE [--message NAME] [--key]

For protobuf, FILE is a .proto (its imports beside it): compiled with protoc
into Python classes, NAME the message; what it imports is registered as
references, as the serializer does.
"""

import argparse
import decimal
import importlib
import json
import os
import subprocess
import sys
import tempfile

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext


def protobuf_class(schema_file, message):
    out = tempfile.mkdtemp(prefix="idemsink-proto-")
    folder = os.path.dirname(os.path.abspath(schema_file))
    protos = [f for f in os.listdir(folder) if f.endswith(".proto")]
    subprocess.run(["protoc", "-I", folder, "--python_out", out] + protos, check=True)
    sys.path.insert(0, out)
    module = importlib.import_module(os.path.basename(schema_file)[: -len(".proto")] + "_pb2")
    return getattr(module, message)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--registry", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--format", required=True, choices=["avro", "protobuf", "json_schema"])
    p.add_argument("--schema", required=True)
    p.add_argument("--message")
    p.add_argument("--key", action="store_true")
    a = p.parse_args()

    client = SchemaRegistryClient({"url": a.registry})
    ctx = SerializationContext(a.topic, MessageField.KEY if a.key else MessageField.VALUE)
    with open(a.schema) as f:
        schema = f.read()
    if a.format == "avro":
        from confluent_kafka.schema_registry.avro import AvroSerializer

        ser = AvroSerializer(client, schema)
        encode = lambda obj: ser(obj, ctx)
    elif a.format == "json_schema":
        from confluent_kafka.schema_registry.json_schema import JSONSerializer

        ser = JSONSerializer(schema, client)
        encode = lambda obj: ser(obj, ctx)
    else:
        from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
        from google.protobuf.json_format import ParseDict

        cls = protobuf_class(a.schema, a.message)
        ser = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
        encode = lambda obj: ser(ParseDict(obj, cls()), ctx)

    for line in sys.stdin:
        line = line.strip()
        if line:
            # Avro decimals are written from Decimal values: 12.50 keeps its scale.
            obj = json.loads(line, parse_float=decimal.Decimal if a.format == "avro" else float)
            print(encode(obj).hex())


if __name__ == "__main__":
    main()
