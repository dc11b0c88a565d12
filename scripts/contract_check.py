#!/usr/bin/env python3
"""An independent reading of ../shared/CACHE_CONTRACT.md, to check a rebuild.

    scripts/contract_check.py generate [--seed N] [--videos N]
    scripts/contract_check.py mutate [--seed N] [--changes N] [--videos N]
    scripts/contract_check.py check

`generate` fills the four collections with small, hostile documents (ids
that repeat or collide with their ObjectId's hex, every BSON type, legacy
`categoryId`, whitespace and control characters in names, dates a
JavaScript `Date` cannot hold, numbers JavaScript prints in exponent form)
and plants, under the prefix, keys of no family (which must survive) and
stale keys of the families (which a rebuild must delete).
`check` computes every data key the contract asks for from what MongoDB
holds now, reads every key under the prefix from Redis and prints each
difference: a key missing, a key that should not be there, another type,
another value, a TTL outside its tier; and the job status keys of
section 3 (CACHEWRIGHT_STATUS_PREFIX, default `cachewright:`) for their
types, fields and TTLs. It exits 1 when there is a difference.
`mutate` makes random changes of the same kind, for a watcher to apply.

It shares no code with cachewright: it walks the BSON bytes itself, and
where the contract is silent it follows docs/CONTRACT_CHOICES.md. So a
difference is either a bug in cachewright or a misreading here; both are
worth knowing. Environment: MONGODB_URI, MONGODB_DB, REDIS_URL,
CACHEWRIGHT_PREFIX (default `app:`), CACHEWRIGHT_HOME_LIMIT (default 500,
the one section `latest`); the defaults' tiers, jitter 0.1 and search
prefixes of 2 and 3 characters.
"""
import base64
import json
import math
import os
import random
import re
import struct
import sys
import unicodedata
from decimal import Decimal, InvalidOperation

USABLE = re.compile(r"[0-9A-Za-z_-]{1,128}")
TIERS = {"count": 3600, "index": 7200, "detail": 86400, "catalog": 604800}
JITTER = 0.1
SEARCH_LENGTHS = (2, 3)
HOME_LIMIT = int(os.environ.get("CACHEWRIGHT_HOME_LIMIT") or 500)


# --- BSON, read from the bytes so every type and the field order survive ---

class T:
    """A BSON value with its type code: `T(code, value)`."""

    __slots__ = ("code", "value")

    def __init__(self, code, value):
        self.code, self.value = code, value

    def __repr__(self):
        return f"T({self.code:#x}, {self.value!r})"


def cstring(buf, at):
    end = buf.index(b"\x00", at)
    return buf[at:end].decode("utf-8"), end + 1


def bson_string(buf, at):
    (n,) = struct.unpack_from("<i", buf, at)
    return buf[at + 4:at + 4 + n - 1].decode("utf-8"), at + 4 + n


def parse_doc(buf, at=0):
    """A document's elements as a list of (name, T), in stored order."""
    (size,) = struct.unpack_from("<i", buf, at)
    end, at, out = at + size - 1, at + 4, []
    while at < end:
        code = buf[at]
        name, at = cstring(buf, at + 1)
        value, at = parse_value(buf, at, code)
        out.append((name, T(code, value)))
    return out


def parse_value(buf, at, code):
    if code == 0x01:
        return struct.unpack_from("<d", buf, at)[0], at + 8
    if code in (0x02, 0x0E, 0x0D):  # string, symbol, code
        return bson_string(buf, at)
    if code in (0x03, 0x04):
        (size,) = struct.unpack_from("<i", buf, at)
        return parse_doc(buf, at), at + size
    if code == 0x05:
        (n,) = struct.unpack_from("<i", buf, at)
        return (buf[at + 4], bytes(buf[at + 5:at + 5 + n])), at + 5 + n
    if code == 0x06 or code == 0x0A or code in (0xFF, 0x7F):
        return None, at
    if code == 0x07:
        return bytes(buf[at:at + 12]), at + 12
    if code == 0x08:
        return buf[at] != 0, at + 1
    if code == 0x09:
        return struct.unpack_from("<q", buf, at)[0], at + 8
    if code == 0x0B:
        pattern, at = cstring(buf, at)
        options, at = cstring(buf, at)
        return (pattern, options), at
    if code == 0x0C:
        ns, at = bson_string(buf, at)
        return (ns, bytes(buf[at:at + 12])), at + 12
    if code == 0x0F:
        (size,) = struct.unpack_from("<i", buf, at)
        code_text, _ = bson_string(buf, at + 4)
        return code_text, at + size
    if code == 0x10:
        return struct.unpack_from("<i", buf, at)[0], at + 4
    if code == 0x11:
        inc, t = struct.unpack_from("<II", buf, at)
        return (t, inc), at + 8
    if code == 0x12:
        return struct.unpack_from("<q", buf, at)[0], at + 8
    if code == 0x13:
        return decimal128_text(bytes(buf[at:at + 16])), at + 16
    raise ValueError(f"BSON type {code:#x}")


def decimal128_text(raw):
    """The string form of IEEE 754-2008 decimal128 (BID), as MongoDB's
    drivers print it (the "to-scientific-string" rules)."""
    lo, hi = struct.unpack("<QQ", raw)
    negative = hi >> 63
    if (hi >> 58) & 0x1F == 0x1F:
        return "NaN"
    if (hi >> 58) & 0x1F == 0x1E:
        return "-Infinity" if negative else "Infinity"
    if (hi >> 61) & 0x3 == 0x3:
        exponent = (hi >> 47) & 0x3FFF
        coefficient = 0  # non-canonical: larger than 10^34, taken as zero
    else:
        exponent = (hi >> 49) & 0x3FFF
        coefficient = ((hi & 0x1FFFFFFFFFFFF) << 64) | lo
        if coefficient >= 10**34:
            coefficient = 0
    exponent -= 6176
    digits = str(coefficient)
    adjusted = exponent + len(digits) - 1
    sign = "-" if negative else ""
    if exponent <= 0 and adjusted >= -6:
        if exponent == 0:
            return sign + digits
        point = len(digits) + exponent
        if point > 0:
            return sign + digits[:point] + "." + digits[point:]
        return sign + "0." + "0" * (-point) + digits
    text = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return sign + text + "E" + ("+" if adjusted >= 0 else "") + str(adjusted)


# --- values as the contract reads them ---

def id_text(v):
    """An id's written text, or None when it is not an ObjectId or string."""
    if v.code == 0x07:
        return v.value.hex()
    if v.code == 0x02:
        return v.value
    return None


def usable(v):
    text = id_text(v)
    return text if text is not None and USABLE.fullmatch(text) else None


def number(v):
    """A numeric value as a Decimal (NaN kept), or None when not a number."""
    if v.code in (0x10, 0x12):
        return Decimal(v.value)
    if v.code == 0x01:
        # Exact: MongoDB compares a double with a decimal by their exact values.
        return Decimal(v.value) if not math.isinf(v.value) else Decimal("Infinity" if v.value > 0 else "-Infinity")
    if v.code == 0x13:
        try:
            return Decimal(v.value)
        except InvalidOperation:
            return None
    return None


def is_one(v):
    n = None if v is None else number(v)
    return n is not None and not n.is_nan() and n == 1


def seq_key(v):
    """MongoDB's ascending sort of numbers: NaN first."""
    n = number(v)
    return (0, Decimal(0)) if n.is_nan() else (1, n)


def js_number(x):
    """ECMAScript Number::toString of a double."""
    if math.isnan(x) or math.isinf(x):
        return "null"
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    r = repr(abs(x))
    mantissa, _, exp = r.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    exp10 = (int(exp) if exp else 0) + len(whole)
    if whole == "0":
        exp10 = (int(exp) if exp else 0) - (len(frac) - len(frac.lstrip("0")))
    digits = digits.rstrip("0") or "0"
    k, n = len(digits), exp10
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    text = digits[0] + ("." + digits[1:] if k > 1 else "")
    return sign + text + "e" + ("+" if e >= 0 else "-") + str(abs(e))


def js_date(ms):
    if abs(ms) > 8_640_000_000_000_000:
        return None
    day, rest = divmod(ms, 86_400_000)
    y, m, d = civil_from_days(day)
    hh, rest = divmod(rest, 3_600_000)
    mm, rest = divmod(rest, 60_000)
    ss, milli = divmod(rest, 1000)
    year = f"{y:04d}" if 0 <= y <= 9999 else ("+" if y > 0 else "-") + f"{abs(y):06d}"
    return f"{year}-{m:02d}-{d:02d}T{hh:02d}:{mm:02d}:{ss:02d}.{milli:03d}Z"


def civil_from_days(z):
    z += 719468
    era = z // 146097  # floor division: the C original truncates, hence its adjustment
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return (y + (1 if m <= 2 else 0), m, d)


def js_string(s):
    return json.dumps(s, ensure_ascii=False)


def to_json(v):
    """The contract's BSON -> JSON rule, as compact JSON text."""
    c = v.code
    if c == 0x01:
        return js_number(v.value)
    if c == 0x02:
        return js_string(v.value)
    if c == 0x03:
        return "{" + ",".join(js_string(k) + ":" + to_json(x) for k, x in v.value) + "}"
    if c == 0x04:
        return "[" + ",".join(to_json(x) for _, x in v.value) + "]"
    if c == 0x05:
        return js_string(base64.b64encode(v.value[1]).decode())
    if c == 0x07:
        return js_string(v.value.hex())
    if c == 0x08:
        return "true" if v.value else "false"
    if c == 0x09:
        text = js_date(v.value)
        return "null" if text is None else js_string(text)
    if c == 0x0A:
        return "null"
    if c == 0x0B:
        return "{}"
    if c in (0x10, 0x12):
        return str(v.value)
    if c == 0x13:
        return js_string(v.value)
    if c in (0x0E, 0x0D, 0x0F):
        return js_string(v.value)
    if c == 0x06:
        return js_string("undefined")
    if c == 0x11:
        return js_string(f"Timestamp({v.value[0]}, {v.value[1]})")
    if c == 0xFF:
        return js_string("MinKey")
    if c == 0x7F:
        return js_string("MaxKey")
    if c == 0x0C:
        return js_string(f"DbPointer({v.value[0]}, {v.value[1].hex()})")
    raise ValueError(c)


def first(doc, name):
    for k, v in doc:
        if k == name:
            return v
    return None


def present(v):
    """Absent and null count the same."""
    return v is not None and v.code != 0x0A


# --- JS string functions ---

JS_TRIM = "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
RUST_WHITESPACE = set("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


def segment(text):
    out = []
    for ch in text:
        if ch in "%:*?[]{}\\" or ch in RUST_WHITESPACE or unicodedata.category(ch) == "Cc":
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    return "".join(out)


# --- the expected cache ---

class Catalogue:
    def __init__(self, raw):
        self.channels = self.admit(raw["Channel"], [("name", "string"), ("landingUrl", "string")])
        self.categories = self.admit(raw["Category"], [("name", "string"), ("seq", "number")])
        self.tags = self.admit(raw["Tag"], [("name", "string"), ("seq", "number"), ("categoryId", "id")])
        self.videos = self.admit(raw["VideoMedia"], [("title", "string")])

    def admit(self, docs, required):
        """Good documents in natural order, as (id, elements)."""
        claimed, out = set(), []
        for doc in docs:
            own = first(doc, "_id")
            oid = None if own is None else usable(own)
            if oid is None:
                continue
            if oid in claimed:
                continue
            claimed.add(oid)
            if all(self.typed(first(doc, f), kind) for f, kind in required):
                out.append((oid, doc))
        return out

    @staticmethod
    def typed(v, kind):
        if not present(v):
            return False
        if kind == "string":
            return v.code == 0x02
        if kind == "number":
            return v.code in (0x01, 0x10, 0x12, 0x13)
        return usable(v) is not None


def by_seq(entries):
    return sorted(entries, key=lambda e: (seq_key(first(e[1], "seq")), first(e[1], "name").value.encode(), e[0].encode()))


def expected_keys(raw, prefix):
    cat = Catalogue(raw)
    keys = {}

    def put(tier, name, kind, value):
        keys[prefix + name] = (tier, kind, value)

    categories = dict(cat.categories)
    active_cats = {i: d for i, d in cat.categories if is_one(first(d, "status"))}
    tags = dict(cat.tags)
    active_tags = {i: d for i, d in cat.tags if is_one(first(d, "status"))}

    def tag_payload(i, d):
        return "{" + ",".join([
            '"id":' + js_string(i),
            '"name":' + to_json(first(d, "name")),
            '"categoryId":' + js_string(usable(first(d, "categoryId"))),
            '"seq":' + to_json(first(d, "seq")),
            '"status":' + status_json(d),
        ]) + "}"

    def status_json(d):
        s = first(d, "status")
        return "null" if s is None else to_json(s)

    tags_by_seq = by_seq([(i, d) for i, d in cat.tags if i in active_tags])

    def category_payload(i, d, full_tags):
        own = [(t, td) for t, td in tags_by_seq if usable(first(td, "categoryId")) == i]
        parts = ['"id":' + js_string(i), '"name":' + to_json(first(d, "name"))]
        sub = first(d, "subtitle")
        parts.append('"subtitle":' + (js_string(sub.value) if sub is not None and sub.code == 0x02 else "null"))
        parts.append('"seq":' + to_json(first(d, "seq")))
        if full_tags:
            parts.append('"tags":[' + ",".join(tag_payload(t, td) for t, td in own) + "]")
        elif own:
            parts.append('"tags":[' + ",".join(
                '{"id":' + js_string(t) + ',"name":' + to_json(first(td, "name")) + "}" for t, td in own) + "]")
        if own:
            parts.append('"tagNames":[' + ",".join(to_json(first(td, "name")) for _, td in own) + "]")
        parts.append('"status":' + status_json(d))
        return "{" + ",".join(parts) + "}"

    cats_by_seq = by_seq([(i, d) for i, d in cat.categories if i in active_cats])
    put("catalog", "category:all", "string", "[" + ",".join(category_payload(i, d, False) for i, d in cats_by_seq) + "]")
    for i, d in cats_by_seq:
        put("catalog", f"category:by-id:{i}", "string", category_payload(i, d, False))
        put("catalog", f"category:with-tags:{i}", "string", category_payload(i, d, True))
        own = [(t, td) for t, td in tags_by_seq if usable(first(td, "categoryId")) == i]
        put("detail", f"category:tagnames:flat:{i}", "string",
            " ".join(first(td, "name").value.lower() for _, td in own))
        if own:
            put("catalog", f"tag:list:{i}", "list", [tag_payload(t, td) for t, td in own])
    put("catalog", "tag:all", "string", "[" + ",".join(tag_payload(t, td) for t, td in tags_by_seq) + "]")
    search = {}
    for t, td in tags_by_seq:
        name = first(td, "name").value.strip(JS_TRIM).lower()
        for n in SEARCH_LENGTHS:
            if len(name) >= n:
                search.setdefault(name[:n], set()).add(t)
    for p, members in search.items():
        put("index", f"tag:search:{segment(p)}", "set", members)

    # Channels.
    def refs(d, field):
        """The channel's usable `{id, name}` elements, in stored order."""
        v = first(d, field)
        if v is None or v.code != 0x04:
            return []
        out = []
        for _, e in v.value:
            if e.code != 0x03:
                continue
            rid = first(e.value, "id")
            if rid is None or usable(rid) is None:
                continue
            out.append((usable(rid), first(e.value, "name")))
        return out

    def ref_json(rid, name):
        # `{id, name}` as JavaScript reduces an element: a null name stays, an absent one goes.
        return "{" + '"id":' + js_string(rid) + ("," + '"name":' + to_json(name) if name is not None else "") + "}"

    def channel_payload(i, d, with_cats=False, with_tags=False):
        parts = ['"id":' + js_string(i), '"name":' + to_json(first(d, "name")),
                 '"landingUrl":' + to_json(first(d, "landingUrl"))]
        for f in ("videoCdn", "coverCdn", "clientName", "clientNotice", "remark"):
            v = first(d, f)
            if present(v) and not (v.code == 0x04 and not v.value):
                parts.append(js_string(f) + ":" + to_json(v))
        if with_cats:
            seen, full = set(), []
            for rid, _ in refs(d, "categories"):
                if rid in active_cats and rid not in seen:
                    seen.add(rid)
                    full.append(category_payload(rid, active_cats[rid], False))
            parts.append('"categories":[' + ",".join(full) + "]")
        elif refs(d, "categories"):
            parts.append('"categories":[' + ",".join(ref_json(*r) for r in refs(d, "categories")) + "]")
        if with_tags:
            seen, full = set(), []
            for rid, _ in refs(d, "tags"):
                if rid in active_tags and rid not in seen:
                    seen.add(rid)
                    full.append(tag_payload(rid, active_tags[rid]))
            parts.append('"tags":[' + ",".join(full) + "]")
        elif refs(d, "tags"):
            parts.append('"tags":[' + ",".join(ref_json(*r) for r in refs(d, "tags")) + "]")
        v = first(d, "tagNames")
        if present(v) and not (v.code == 0x04 and not v.value):
            parts.append('"tagNames":' + to_json(v))
        return "{" + ",".join(parts) + "}"

    channels = sorted(cat.channels, key=lambda e: (first(e[1], "name").value.encode(), e[0].encode()))
    put("catalog", "channel:all", "string", "[" + ",".join(channel_payload(i, d) for i, d in channels) + "]")
    for i, d in channels:
        put("catalog", f"channel:by-id:{i}", "string", channel_payload(i, d))
        put("catalog", f"channel:with-categories:{i}", "string", channel_payload(i, d, with_cats=True))
        put("catalog", f"channel:with-tags:{i}", "string", channel_payload(i, d, with_tags=True))
        cs = {r for r, _ in refs(d, "categories") if r in active_cats}
        ts = {r for r, _ in refs(d, "tags") if r in active_tags}
        if cs:
            put("catalog", f"channel:categories:{i}", "set", cs)
        if ts:
            put("catalog", f"channel:tags:{i}", "set", ts)

    # Videos.
    members = {c: [] for c in active_cats}
    tag_lists = {}
    for vid, d in cat.videos:
        if not is_one(first(d, "listStatus")):
            continue
        added = first(d, "addedTime")
        ms = added.value if added is not None and added.code == 0x09 else 0
        ids_v, legacy = first(d, "categoryIds"), first(d, "categoryId")
        out = ['"id":' + js_string(vid)]
        cat_refs = None  # the usable references, when the video has categoryIds
        if present(ids_v):
            if ids_v.code == 0x04:
                cat_refs = [usable(x) for _, x in ids_v.value if usable(x) is not None]
        elif present(legacy):
            cat_refs = [usable(legacy)] if usable(legacy) is not None else []
        for k, v in d:
            if k in ("_id", "id"):
                continue
            if k == "categoryIds":
                if present(ids_v) and ids_v.code == 0x04:
                    out.append('"categoryIds":[' + ",".join(js_string(c) for c in cat_refs) + "]")
                continue
            if k == "categoryId":
                if not present(ids_v) and present(legacy) and v is legacy:
                    out.append('"categoryIds":[' + ",".join(js_string(c) for c in cat_refs) + "]")
                continue
            if k == "tagIds" and v.code == 0x04:
                out.append('"tagIds":[' + ",".join(js_string(usable(x)) for _, x in v.value if usable(x) is not None) + "]")
                continue
            if k == "tagIds" and v.code != 0x0A:
                continue
            out.append(js_string(k) + ":" + to_json(v))
        put("detail", f"video:detail:{vid}", "string", "{" + ",".join(out) + "}")
        cats = []
        for c in cat_refs or []:
            if c in active_cats and c not in cats:
                cats.append(c)
        if cats:
            put("detail", f"video:categories:{vid}", "set", set(cats))
        tv = first(d, "tagIds")
        vtags = []
        if tv is not None and tv.code == 0x04:
            for _, x in tv.value:
                t = usable(x)
                if t is not None and t not in vtags:
                    vtags.append(t)
        for c in cats:
            members[c].append((ms, vid))
        for t in vtags:
            if t in active_tags:
                tc = usable(first(active_tags[t], "categoryId"))
                if tc in cats:
                    tag_lists.setdefault((tc, t), []).append((ms, vid))

    def newest(entries):
        return sorted(entries, key=lambda e: (-e[0], e[1].encode()))

    for c, vs in members.items():
        put("count", f"category:video:count:{c}", "string", str(len(vs)))
        if vs:
            put("index", f"video:category:index:{c}:videos", "zset", {v: float(ms) for ms, v in vs})
            put("index", f"video:category:list:{c}", "list", [v for _, v in newest(vs)])
    for (c, t), vs in tag_lists.items():
        put("index", f"video:tag:list:{c}:{t}", "list", [v for _, v in newest(vs)])
    for i, d in channels:
        pool = {}
        for r, _ in refs(d, "categories"):
            if r in active_cats:
                for ms, v in members[r]:
                    pool[v] = ms
        latest = newest([(ms, v) for v, ms in pool.items()])[:HOME_LIMIT]
        if latest:
            put("index", f"video:list:home:{i}:latest", "zset", {v: float(ms) for ms, v in latest})
    return keys


# --- Redis and MongoDB ---

def read_collections():
    from pymongo import MongoClient
    from bson.raw_bson import RawBSONDocument
    client = MongoClient(os.environ.get("MONGODB_URI", "mongodb://127.0.0.1:27017"), document_class=RawBSONDocument)
    db = client[os.environ.get("MONGODB_DB", "app")]
    return {c: [parse_doc(d.raw) for d in db[c].find({})] for c in ("Channel", "Category", "Tag", "VideoMedia")}


def redis_client():
    import redis
    from redis.cluster import RedisCluster
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379")
    r = redis.Redis.from_url(url)
    if r.info("cluster").get("cluster_enabled"):
        # Every master's keys, each command sent to its slot's master.
        r = RedisCluster.from_url(url)
    return r


# Keys under the prefix that belong to no family (a placeholder with a
# `:` or a character no id has, a segment more, an encoding that is not
# canonical): the contract says no one reads, writes or deletes them.
FOREIGN = ["video:detail:a:b", "video:detail:bad!id", "unregistered", "tag:search:%zz", "video:categories:",
           "video:category:index:c1:other", "category:all:x"]


# Keys of families that no document produces, as a deleted entity leaves
# them: a rebuild deletes them ("extra" otherwise).
STALE = ["video:detail:zz-stale", "video:category:list:zz-stale", "tag:search:zz%20", "video:list:home:zz:latest"]


def plant_foreign(prefix):
    r = redis_client()
    for name in FOREIGN:
        r.set(prefix + name, "foreign " + name)
    for name in STALE:
        r.set(prefix + name, "stale", ex=3600)


def read_redis(prefix):
    r = redis_client()
    out = {}
    for raw in r.scan_iter(match=prefix.encode() + b"*", count=1000):
        key = raw.decode("utf-8", "replace")
        kind = r.type(raw).decode()
        ttl = r.ttl(raw)
        if kind == "string":
            value = r.get(raw).decode("utf-8", "replace")
        elif kind == "list":
            value = [x.decode("utf-8", "replace") for x in r.lrange(raw, 0, -1)]
        elif kind == "set":
            value = {x.decode("utf-8", "replace") for x in r.smembers(raw)}
        elif kind == "zset":
            value = {m.decode("utf-8", "replace"): s for m, s in r.zrange(raw, 0, -1, withscores=True)}
        else:
            value = None
        out[key] = (kind, value, ttl)
    return out


def check():
    prefix = os.environ.get("CACHEWRIGHT_PREFIX", "app:")
    want = expected_keys(read_collections(), prefix)
    have = read_redis(prefix)
    problems = []
    for name in FOREIGN:
        # Only once planted (`generate` does): a checker run by hand on a
        # cache of its own checks the rest.
        got = have.get(prefix + name)
        if got is not None and got[1] != "foreign " + name:
            problems.append(f"foreign  {prefix + name}: rewritten as {got}")
    planted = sum(1 for name in FOREIGN if prefix + name in have)
    if 0 < planted < len(FOREIGN):
        problems.append(f"foreign  {len(FOREIGN) - planted} of the keys of no family were deleted")
    for key in sorted(set(want) | set(have)):
        if key not in have:
            problems.append(f"missing  {key}: {str(want[key][2])[:300]}")
            continue
        if key not in want:
            if family_of(key, prefix):
                problems.append(f"extra    {key}: {str(have[key][1])[:300]}")
            continue
        tier, kind, value = want[key]
        got_kind, got, ttl = have[key]
        if got_kind != kind:
            problems.append(f"type     {key}: {got_kind}, expected {kind}")
        elif got != value:
            problems.append(f"value    {key}:\n    got      {str(got)[:600]}\n    expected {str(value)[:600]}")
        low, high = TIERS[tier] * 0.99, TIERS[tier] * (1 + JITTER) + 1
        if not low <= ttl <= high:
            problems.append(f"ttl      {key}: {ttl}, expected {TIERS[tier]}..{int(high)}")
    problems += status_problems(os.environ.get("CACHEWRIGHT_STATUS_PREFIX", "cachewright:"))
    for p in problems:
        print(p)
    print(f"{len(want)} keys expected, {len(have)} under the prefix, {len(problems)} differences")
    return 1 if problems else 0


JOB_FIELDS = {"run_id", "trigger", "status", "current_builder", "progress_current", "progress_total",
              "started_at", "updated_at", "finished_at", "error_count", "last_error", "keys_written",
              "keys_deleted", "rejected"}
BUILDER_FIELDS = {"status", "current", "total", "started_at", "updated_at"}


def status_problems(prefix):
    """The job status keys of section 3: their types, fields and TTLs."""
    import time
    r, out, now = redis_client(), [], time.time()
    run_id = re.compile(r"[0-9a-f]{16}")

    def seconds(value):
        # Unix seconds: an integer within a day of now (empty while unset).
        return value == "" or (value.isdigit() and abs(int(value) - now) < 86400)

    jobs = {}
    for raw in r.scan_iter(match=prefix.encode() + b"job:*", count=1000):
        key = raw.decode()
        rest = key[len(prefix) + len("job:"):]
        rid, _, builder = rest.partition(":builder:")
        fields = {k.decode(): v.decode() for k, v in r.hgetall(raw).items()}
        ttl = r.ttl(raw)
        if not run_id.fullmatch(rid) or r.type(raw) != b"hash":
            out.append(f"status   {key}: not a hash of a 16-hex run id")
            continue
        if not 0 < ttl <= 86400:
            out.append(f"status   {key}: TTL {ttl}, expected at most 24h")
        want = BUILDER_FIELDS if builder else JOB_FIELDS
        if set(fields) != want:
            out.append(f"status   {key}: fields {sorted(set(fields) ^ want)} differ from the contract's")
            continue
        if not all(seconds(fields[f]) for f in ("started_at", "updated_at")):
            out.append(f"status   {key}: timestamps {fields['started_at']}, {fields['updated_at']} are not unix seconds")
        if not builder:
            jobs[rid] = fields
            if fields["run_id"] != rid or fields["status"] not in ("running", "completed", "failed") or \
                    fields["trigger"] not in ("cron", "manual", "migration", "change-stream") or \
                    not seconds(fields["finished_at"]):
                out.append(f"status   {key}: {fields}")
    for state in ("active", "completed", "failed"):
        key = f"{prefix}jobs:{state}"
        if r.exists(key):
            if r.type(key) != b"set" or r.ttl(key) != -1:
                out.append(f"status   {key}: a set without TTL expected")
        running = {"active": "running"}.get(state, state)
        for rid, fields in jobs.items():
            member = r.sismember(key, rid) if r.exists(key) else False
            if fields["status"] == running and not member:
                out.append(f"status   {key}: lacks {fields['status']} run {rid}")
    total = r.get(f"{prefix}stats:total_jobs")
    if total is not None and (not total.isdigit() or r.ttl(f"{prefix}stats:total_jobs") != -1):
        out.append(f"status   {prefix}stats:total_jobs: {total!r}, an integer without TTL expected")
    for raw in r.scan_iter(match=prefix.encode() + b"cdc:resume:*", count=1000):
        if r.type(raw) != b"string" or r.ttl(raw) != -1:
            out.append(f"status   {raw.decode()}: a string without TTL expected")
    health = f"{prefix}health:current"
    if r.exists(health) and not 0 < r.ttl(health) <= 60:
        out.append(f"status   {health}: TTL {r.ttl(health)}, expected at most 60 s")
    return out


FAMILIES = [
    "channel:all", "channel:by-id:{id}", "channel:with-categories:{id}", "channel:with-tags:{id}",
    "channel:categories:{id}", "channel:tags:{id}", "category:all", "category:by-id:{id}",
    "category:with-tags:{id}", "category:video:count:{id}", "category:tagnames:flat:{id}", "tag:all",
    "tag:list:{id}", "tag:search:{text}", "video:detail:{id}", "video:categories:{id}",
    "video:category:index:{id}:videos", "video:category:list:{id}", "video:tag:list:{id}:{id}",
    "video:list:home:{id}:{text}",
]


def canonical_text(seg):
    """Whether `seg` is some text's segment exactly as `segment` writes it."""
    try:
        raw = re.sub(rb"%([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]), seg.encode())
        return segment(raw.decode("utf-8")) == seg
    except UnicodeDecodeError:
        return False


def family_of(key, prefix):
    """Whether a key belongs to a family: its literal segments, and each
    placeholder a usable id or a canonically encoded text."""
    parts = key[len(prefix):].split(":")
    for pattern in FAMILIES:
        want = pattern.split(":")
        if len(want) == len(parts) and all(
                (w == "{id}" and USABLE.fullmatch(p)) or (w == "{text}" and p and canonical_text(p)) or w == p
                for w, p in zip(want, parts)):
            return True
    return False


# --- hostile data ---

class Hostile:
    """Random documents from small id pools, so ids repeat, collide with
    an ObjectId's hex and dangle, with every BSON type in every field."""

    def __init__(self, seed, videos):
        from bson import ObjectId
        self.rnd, self.videos = random.Random(seed), videos
        self.oids = [ObjectId(bytes([n] * 12)) for n in range(1, 6)]

    def an_id(self, pool, n):
        rnd = self.rnd
        roll = rnd.random()
        if roll < 0.65:
            return f"{pool}{rnd.randrange(n)}"
        if roll < 0.75:
            # Ids that sort apart by byte ('-' < digits < capitals < '_' < small letters).
            return rnd.choice([pool.upper(), pool + "_", pool + "-", "_" + pool, "-"]) + str(rnd.randrange(n // 3 + 1))
        if roll < 0.85:
            return rnd.choice(self.oids)
        if roll < 0.9:
            return str(rnd.choice(self.oids))
        return rnd.choice(["bad id", "", "x" * 129, 7, None, "ok-_9Z", "ü"])

    def text(self):
        alphabet = ["a", "b", "B", "z", " ", "\t", "\u3000", "\xa0", "\x85", "\x1f", "%", ":", "*", "?", "[", "{",
                    "\\", "\"", "/", "\u2028", "İ", "Σ", "ς", "动", "作", "é", "\U0001F600", "\x7f", "ǅ", "ẞ"]
        return "".join(self.rnd.choice(alphabet) for _ in range(self.rnd.randrange(0, 7)))

    def num(self):
        from bson import Int64, Decimal128
        return self.rnd.choice([
            1, 0, 2, -1, Int64(1), Int64(2**40), 1.0, 0.5, 0.1, 1e21, 1e-7, 123456789.123, -0.0,
            float("nan"), float("inf"), 5e-324, 1.7976931348623157e308,
            Decimal128("1"), Decimal128("1.0"), Decimal128("2.5"), Decimal128("1E+3"), Decimal128("0.1"),
            Decimal128("-0"), Decimal128("0.000001"), Decimal128("1.0000000000000000000000000000001"),
            Decimal128("NaN"), Decimal128("-Infinity"), "1", True, None, Int64(2**63 - 1), -2**31, 1e-6, 1e300,
            -1e-300, 999999999999999900000.0, 0.000001234, Decimal128("-1.5E-20")])

    def status(self):
        return 1 if self.rnd.random() < 0.7 else self.num()

    def seq(self):
        return self.num() if self.rnd.random() < 0.5 else self.rnd.randrange(4)

    def anything(self, depth=0):
        from bson import Binary, Regex, Timestamp, MinKey, MaxKey, Code
        from bson.datetime_ms import DatetimeMS
        rnd = self.rnd
        choices = [self.text, self.num, lambda: rnd.choice(self.oids), lambda: DatetimeMS(rnd.choice(
            [0, 1_700_000_000_123, -1, -62_198_755_200_000, 253_402_300_800_000, 8_640_000_000_000_001,
             -8_640_000_000_000_000])),
            lambda: Binary(bytes(rnd.randrange(256) for _ in range(rnd.randrange(5))), rnd.choice([0, 4, 128])),
            lambda: "a\x00b" + self.text(), lambda: {"_id": 1, "id": self.text(), "a.b": [None]},
            lambda: Regex("a.*", "i"), lambda: Timestamp(1700000000, 7), lambda: MinKey(), lambda: MaxKey(),
            lambda: Code("x()"), lambda: None, lambda: True, lambda: []]
        if depth < 2:
            choices += [lambda: [self.anything(depth + 1) for _ in range(rnd.randrange(3))],
                        lambda: {self.text() or "k": self.anything(depth + 1) for _ in range(rnd.randrange(3))}]
        return rnd.choice(choices)()

    def maybe(self, d, field, value, p=0.9):
        if self.rnd.random() < p:
            d[field] = value

    def category(self):
        d = {"_id": self.an_id("c", 30)}
        self.maybe(d, "name", self.text() if self.rnd.random() < 0.9 else self.anything())
        self.maybe(d, "subtitle", self.rnd.choice([self.text(), None, 5]), 0.7)
        self.maybe(d, "seq", self.seq())
        self.maybe(d, "status", self.status())
        return d

    def tag(self):
        d = {"_id": self.an_id("t", 60)}
        self.maybe(d, "name", self.text() if self.rnd.random() < 0.9 else self.anything())
        self.maybe(d, "categoryId", self.an_id("c", 30))
        self.maybe(d, "seq", self.seq())
        self.maybe(d, "status", self.status())
        return d

    def channel(self):
        rnd = self.rnd
        d = {"_id": self.an_id("h", 10), "name": self.text() if rnd.random() < 0.95 else None,
             "landingUrl": self.text() if rnd.random() < 0.95 else 3}
        for f in ("videoCdn", "coverCdn", "clientName", "clientNotice", "remark"):
            self.maybe(d, f, self.anything(), 0.5)

        def ref(pool, n):
            return rnd.choice([{"id": self.an_id(pool, n), "name": self.text()}, {"id": self.an_id(pool, n)},
                               {"id": self.an_id(pool, n), "name": self.anything(), "extra": 1}, "x"])
        self.maybe(d, "categories", [ref("c", 30) for _ in range(rnd.randrange(6))] if rnd.random() < 0.9 else "c1", 0.8)
        self.maybe(d, "tags", [ref("t", 60) for _ in range(rnd.randrange(6))], 0.8)
        self.maybe(d, "tagNames", [self.text() for _ in range(rnd.randrange(3))], 0.5)
        return d

    def video_fields(self):
        from bson.datetime_ms import DatetimeMS
        rnd, fields = self.rnd, []
        if rnd.random() < 0.95:
            fields.append(("title", self.text() if rnd.random() < 0.95 else self.anything()))
        if rnd.random() < 0.85:
            fields.append(("listStatus", self.status()))
        if rnd.random() < 0.9:
            fields.append(("addedTime", rnd.choice([DatetimeMS(1_700_000_000_000 + rnd.randrange(0, 5) * 1000),
                                                    DatetimeMS(rnd.randrange(-10**6, 10**6)), "2024", None])))
        roll = rnd.random()
        if roll < 0.6:
            fields.append(("categoryIds", [self.an_id("c", 30) for _ in range(rnd.randrange(4))]))
        elif roll < 0.75:
            fields.append(("categoryId", self.an_id("c", 30)))
        elif roll < 0.85:
            fields.append(("categoryId", self.an_id("c", 30)))
            fields.append(("categoryIds", rnd.choice([None, [self.an_id("c", 30)], "c1"])))
        elif roll < 0.9:
            fields.append(("categoryIds", None))
        if rnd.random() < 0.8:
            fields.append(("tagIds", rnd.choice([[self.an_id("t", 60) for _ in range(rnd.randrange(4))], None, "t1"])))
        for k in range(rnd.randrange(4)):
            fields.append((rnd.choice(["id", "extra", "n" + str(k), "a.b", "categoryId ", self.text() or "e"]),
                           self.anything()))
        rnd.shuffle(fields)
        return fields

    def video(self):
        d = {"_id": self.an_id("v", self.videos)}
        for k, v in self.video_fields():
            d.setdefault(k, v)
        return d


def database():
    from pymongo import MongoClient
    client = MongoClient(os.environ.get("MONGODB_URI", "mongodb://127.0.0.1:27017"))
    return client[os.environ.get("MONGODB_DB", "app")]


def insert(collection, docs):
    from pymongo.errors import BulkWriteError
    try:
        # Unordered: an `_id` drawn twice is refused by MongoDB, the rest land in order.
        collection.insert_many(docs, ordered=False)
    except BulkWriteError:
        pass


def generate(seed, videos):
    db, h = database(), Hostile(seed, videos)
    for c in ("Channel", "Category", "Tag", "VideoMedia"):
        db[c].drop()
    insert(db.Category, [h.category() for _ in range(40)])
    insert(db.Tag, [h.tag() for _ in range(80)])
    insert(db.Channel, [h.channel() for _ in range(12)])
    insert(db.VideoMedia, [h.video() for _ in range(videos)])
    plant_foreign(os.environ.get("CACHEWRIGHT_PREFIX", "app:"))
    # (Rebuild next: the stale keys planted here are then gone.)
    print(f"generated hostile data, seed {seed}, {videos} videos drawn")


def mutate(seed, count, videos):
    """`count` random changes, as a watcher would meet them: inserts,
    replacements, field updates and unsets, deletes, in every collection."""
    from pymongo.errors import OperationFailure
    db, h = database(), Hostile(seed, videos)
    rnd = h.rnd
    makers = {"Category": h.category, "Tag": h.tag, "Channel": h.channel, "VideoMedia": h.video}
    for _ in range(count):
        name = rnd.choices(list(makers), weights=[2, 2, 1, 10])[0]
        coll = db[name]
        ids = [d["_id"] for d in coll.find({}, {"_id": 1})]
        roll = rnd.random()
        if roll < 0.25 or not ids:
            insert(coll, [makers[name]()])
        elif roll < 0.4:
            coll.delete_one({"_id": rnd.choice(ids)})
        elif roll < 0.55:
            doc = makers[name]()
            doc.pop("_id")
            coll.replace_one({"_id": rnd.choice(ids)}, doc)
        else:
            target = rnd.choice(ids)
            if name == "VideoMedia":
                field, value = rnd.choice(h.video_fields() or [("title", "t")])
            else:
                doc = makers[name]()
                doc.pop("_id")
                field, value = rnd.choice(list(doc.items()) or [("name", "n")])
            roll = rnd.random()
            if roll < 0.15:
                update = {"$unset": {field: ""}}
            elif roll < 0.3 and name == "VideoMedia":
                # Path and array operators: the event names a part of a field.
                update = rnd.choice([
                    {"$push": {"categoryIds": h.an_id("c", 30)}}, {"$set": {"categoryIds.0": h.an_id("c", 30)}},
                    {"$pull": {"tagIds": h.an_id("t", 60)}}, {"$rename": {"categoryId": "categoryIds"}},
                    {"$inc": {"listStatus": rnd.choice([1, -1])}}, {"$set": {"extra.a.b": h.anything()}}])
            else:
                update = {"$set": {field: value}}
            try:
                coll.update_one({"_id": target}, update)
            except OperationFailure:
                pass  # an operator the document's types refuse, as MongoDB would
    print(f"made {count} changes, seed {seed}")


def main():
    args = sys.argv[1:]
    if args[:1] == ["generate"]:
        opts = dict(zip(args[1::2], args[2::2]))
        generate(int(opts.get("--seed", 1)), int(opts.get("--videos", 300)))
        return 0
    if args[:1] == ["mutate"]:
        opts = dict(zip(args[1::2], args[2::2]))
        mutate(int(opts.get("--seed", 1)), int(opts.get("--changes", 100)), int(opts.get("--videos", 400)))
        return 0
    if args[:1] == ["check"]:
        return check()
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
