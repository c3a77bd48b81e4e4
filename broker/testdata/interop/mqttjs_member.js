#!/usr/bin/env node
// A LuffyMQ shared-group member written with MQTT.js and no LuffyMQ code.
//
// It connects at MQTT v5, subscribes to $share/<group>/<topic> at QoS 1 and
// processes one message at a time for --processing-ms. MQTT.js acknowledges a
// QoS 1 message when the client's handleMessage(packet, callback) calls its
// callback (and handles no further packet until then), so calling it after
// the work means the PUBACK is sent after processing. Every --report-every-ms
// the member publishes its load to $luffy/load.
//
// Standard output, one line each: "ready" once subscribed, "processed
// <payload>" after each message, "report <json>" for each load report.
// The member exits when its standard input closes (its parent is gone).
//
// Used by broker/interop_clients_test.go; install MQTT.js with
// `npm ci --prefix broker/testdata/interop` (scripts/ensure-deps.sh does).
'use strict';

const mqtt = require('mqtt');

// The load-report topic and JSON keys of clientsdk/report.
// TestInteropScriptsUseTheReportWireFormat checks them against the Go code.
const LOAD_TOPIC = '$luffy/load';
const REPORT_KEYS = { pending: 'msgsInQueue', processingTime: 'processingTimePerMsg', processed: 'processed' };

function parseArgs(argv) {
  const opts = {
    host: '127.0.0.1',
    port: 1883,
    clientId: 'mqttjs-member',
    group: 'g',
    topic: 'jobs',
    processingMs: 10,
    reportEveryMs: 100,
  };
  const names = {
    '--host': ['host', String],
    '--port': ['port', Number],
    '--client-id': ['clientId', String],
    '--group': ['group', String],
    '--topic': ['topic', String],
    '--processing-ms': ['processingMs', Number],
    '--report-every-ms': ['reportEveryMs', Number],
  };
  for (let i = 0; i < argv.length; i += 2) {
    const spec = names[argv[i]];
    if (!spec || i + 1 >= argv.length) {
      throw new Error(`unknown or incomplete option ${argv[i]}; known: ${Object.keys(names).join(' ')}`);
    }
    const value = spec[1](argv[i + 1]);
    if (spec[1] === Number && !Number.isFinite(value)) {
      throw new Error(`${argv[i]} needs a number, got ${argv[i + 1]}`);
    }
    opts[spec[0]] = value;
  }
  return opts;
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  const filter = `$share/${opts.group}/${opts.topic}`;
  const say = (line) => process.stdout.write(line + '\n');
  const fail = (what, err) => {
    process.stderr.write(`${opts.clientId}: ${what}: ${err && err.message ? err.message : err}\n`);
    process.exit(1);
  };

  // Mean processing time of the messages processed since the last report.
  let processedSinceReport = 0;
  let processingSinceReportMs = 0;

  const client = mqtt.connect({
    host: opts.host,
    port: opts.port,
    protocol: 'mqtt',
    protocolVersion: 5,
    clientId: opts.clientId,
    clean: true,
    keepalive: 30,
    reconnectPeriod: 0, // a lost connection is a failure here, not something to hide
  });

  // One message at a time: the PUBACK goes out when callback is called.
  client.handleMessage = (packet, callback) => {
    const started = performance.now();
    setTimeout(() => {
      processingSinceReportMs += performance.now() - started;
      processedSinceReport++;
      say(`processed ${packet.payload.toString()}`);
      callback();
    }, opts.processingMs);
  };

  const sendReport = () => {
    const load = {
      // Messages received but not yet taken for processing: MQTT.js hands
      // this member one message at a time, so it never holds any waiting.
      [REPORT_KEYS.pending]: 0,
      [REPORT_KEYS.processingTime]: processedSinceReport > 0 ? processingSinceReportMs / processedSinceReport : 0,
      [REPORT_KEYS.processed]: processedSinceReport,
    };
    processedSinceReport = 0;
    processingSinceReportMs = 0;
    const payload = JSON.stringify(load);
    client.publish(LOAD_TOPIC, payload, { qos: 0 }, (err) => {
      if (err) fail('publishing a load report', err);
    });
    say(`report ${payload}`);
  };

  client.on('connect', () => {
    client.subscribe(filter, { qos: 1 }, (err, granted) => {
      if (err) return fail(`subscribing to ${filter}`, err);
      if (!granted || granted.length !== 1 || granted[0].qos > 2) {
        return fail(`subscribing to ${filter}`, `refused: ${JSON.stringify(granted)}`);
      }
      sendReport();
      setInterval(sendReport, opts.reportEveryMs);
      say('ready');
    });
  });
  client.on('error', (err) => fail('connection error', err));
  client.on('close', () => fail('connection', 'closed'));

  process.stdin.on('data', () => {});
  process.stdin.on('end', () => process.exit(0));
  process.stdin.resume();
}

main();
