#!/usr/bin/python3
"""A LuffyMQ shared-group member written with Eclipse Paho (Python) and no
LuffyMQ code.

It connects at MQTT v5, subscribes to $share/<group>/<topic> at QoS 1 and
processes one message at a time for --processing-ms. Paho sends the PUBACK of
a QoS 1 message when on_message returns, so doing the work inside on_message
means the acknowledgement follows the processing. Every --report-every-ms a
second thread publishes the member's load to $luffy/load (paho queues it and
its network thread writes it, after the message in progress if any).

Written for paho-mqtt 1.6 (Debian bookworm's python3-paho-mqtt), which the
tests run. With paho 2.x it asks for the 1.x callback signatures (not run by
the tests here). Run it with /usr/bin/python3, where Debian installs paho.

Standard output, one line each: "ready" once subscribed, "processed
<payload>" after each message, "report <json>" for each load report. The
member exits when its standard input closes (its parent is gone).

Used by broker/interop_clients_test.go.
"""

import argparse
import json
import os
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.subscribeoptions import SubscribeOptions

# The load-report topic and JSON keys of clientsdk/report.
# TestInteropScriptsUseTheReportWireFormat checks them against the Go code.
LOAD_TOPIC = "$luffy/load"
REPORT_KEYS = {"pending": "msgsInQueue", "processingTime": "processingTimePerMsg", "processed": "processed"}


class Member:
    """One shared-group member: processes messages and reports its load."""

    def __init__(self, opts):
        self.opts = opts
        self.filter = "$share/%s/%s" % (opts.group, opts.topic)
        self.out_lock = threading.Lock()
        self.stats_lock = threading.Lock()
        self.processed_since_report = 0
        self.processing_since_report_ms = 0.0
        kwargs = {"client_id": opts.client_id, "protocol": mqtt.MQTTv5}
        if hasattr(mqtt, "CallbackAPIVersion"):  # paho 2.x
            kwargs["callback_api_version"] = mqtt.CallbackAPIVersion.VERSION1
        self.client = mqtt.Client(**kwargs)
        self.client.on_connect = self.on_connect
        self.client.on_subscribe = self.on_subscribe
        self.client.on_message = self.on_message
        self.client.on_disconnect = self.on_disconnect

    def say(self, line):
        with self.out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def fail(self, what):
        sys.stderr.write("%s: %s\n" % (self.opts.client_id, what))
        sys.stderr.flush()
        os._exit(1)

    def on_connect(self, client, userdata, flags, reason_code, properties):
        if reason_code != 0:
            self.fail("connect refused: %s" % reason_code)
        result, _ = client.subscribe(self.filter, options=SubscribeOptions(qos=1))
        if result != mqtt.MQTT_ERR_SUCCESS:
            self.fail("subscribing to %s: %s" % (self.filter, mqtt.error_string(result)))

    def on_subscribe(self, client, userdata, mid, reason_codes, properties):
        if len(reason_codes) != 1 or reason_codes[0].value >= 0x80:
            self.fail("subscribing to %s refused: %s" % (self.filter, reason_codes))
        self.send_report()
        threading.Thread(target=self.report_loop, daemon=True).start()
        self.say("ready")

    def on_message(self, client, userdata, message):
        started = time.monotonic()
        time.sleep(self.opts.processing_ms / 1000.0)  # the work
        elapsed_ms = (time.monotonic() - started) * 1000.0
        with self.stats_lock:
            self.processed_since_report += 1
            self.processing_since_report_ms += elapsed_ms
        self.say("processed " + message.payload.decode("utf-8", "replace"))

    def on_disconnect(self, client, userdata, reason_code, properties=None):
        self.fail("connection closed: %s" % reason_code)

    def send_report(self):
        with self.stats_lock:
            processed = self.processed_since_report
            mean_ms = self.processing_since_report_ms / processed if processed else 0
            self.processed_since_report = 0
            self.processing_since_report_ms = 0.0
        load = {
            # Messages received but not yet taken for processing: paho hands
            # this member one message at a time, so it never holds any waiting.
            REPORT_KEYS["pending"]: 0,
            REPORT_KEYS["processingTime"]: mean_ms,
            REPORT_KEYS["processed"]: processed,
        }
        payload = json.dumps(load)
        info = self.client.publish(LOAD_TOPIC, payload, qos=0)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            self.fail("publishing a load report: %s" % mqtt.error_string(info.rc))
        self.say("report " + payload)

    def report_loop(self):
        every = self.opts.report_every_ms / 1000.0
        next_at = time.monotonic() + every
        while True:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += every
            self.send_report()

    def run(self):
        self.client.connect(self.opts.host, self.opts.port, keepalive=30, clean_start=True)
        self.client.loop_forever()


def exit_when_stdin_closes():
    for _ in sys.stdin:
        pass
    os._exit(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=1883)
    parser.add_argument("--client-id", default="paho-member")
    parser.add_argument("--group", default="g")
    parser.add_argument("--topic", default="jobs")
    parser.add_argument("--processing-ms", type=float, default=10)
    parser.add_argument("--report-every-ms", type=float, default=100)
    opts = parser.parse_args()
    threading.Thread(target=exit_when_stdin_closes, daemon=True).start()
    Member(opts).run()


if __name__ == "__main__":
    main()
