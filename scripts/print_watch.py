#!/usr/bin/env python3
"""Prints a watcher benchmark's figures (`cachewright-dev bench --watch
--out FILE`), for scripts/bench.sh and scripts/bench-watch.sh.

    print_watch.py WATCH_JSON VIDEOS SETUP
"""
import json, sys
w = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]} videos, {sys.argv[3]}, mix {w['mix']} (seed {w['seed']}), window {w['window_ms']} ms")
print(f"  latency at {w['rate_per_s']}/s      p50 {w['latency_p50_ms']:.0f} ms, p99 {w['latency_p99_ms']:.0f} ms "
      f"(beyond the window p99 {w['beyond_window_p99_ms']:.0f} ms)")
print(f"  MongoDB's delivery       p50 {w['delivery_p50_ms']:.0f} ms, p99 {w['delivery_p99_ms']:.0f} ms "
      f"(sent to an event at a bare change stream)")
print(f"  sustained                {w['sustained_per_s']:.0f} changes/s ({w['sustained_updates']} in {w['sustained_seconds']:.1f} s; "
      f"MongoDB took them in {w['sent_seconds']:.1f} s)")
d = w.get('drain')
if d:
    print(f"  drained                  {d['per_s']:.0f} changes/s ({d['changes']} in {d['seconds']:.2f} s, a backlog held "
          f"back from the watcher while MongoDB took it in {d['sent_seconds']:.1f} s)")
    c = d['cpu_us_per_change']
    print(f"  drain CPU per change     cachewright {c['cachewright']:.0f} µs (state {c['state']:.0f}), "
          f"Redis {c['redis']:.0f} µs, MongoDB {c['mongodb']:.0f} µs")
    for r in d.get('redis_commands', []):
        print(f"    Redis {r['command']:<22} {r['us_per_change']:6.1f} µs, {r['calls_per_change']:.2f} calls per change")
else:
    print("  drained                  n/a (the drain phase needs a single-host mongodb:// URI)")
print(f"  members read per change  {w['visited_per_change']:.1f}")
print(f"  state CPU per change     {w['state_cpu_us_per_change']:.0f} µs (applying to the state and planning)")
print(f"  watcher RSS              peak {w['peak_rss_mib']:.0f} MiB (while applying the flood), "
      f"settled {w['settled_rss_mib']:.0f} MiB; process peak with its rebuild {w['process_peak_rss_mib']:.0f} MiB")
