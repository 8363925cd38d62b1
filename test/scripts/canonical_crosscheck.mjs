// Independent RFC 8785 reference for test/scripts/canonical_crosscheck.sh.
//
// Writes deterministic random JSON documents (seeded PRNG) as TSV lines:
//   id <TAB> base64(document text) <TAB> base64(canonical form) <TAB> sha256 hex
// The document text is deliberately non-canonical: random whitespace, member
// order, escapes and number spellings.  The canonical form is computed here
// with nothing but the JavaScript engine: JSON.parse, then JSON.stringify
// with object keys sorted recursively by the default sort (UTF-16 code
// units).  For I-JSON that is exactly RFC 8785: JSON.stringify writes
// strings with RFC 8785's escapes and numbers with Number::toString.
//
// Usage: node canonical_crosscheck.mjs OUTFILE [COUNT] [SEED]
// Node 18 (Debian 12) or later; no packages.

import { createHash } from 'node:crypto';
import { writeFileSync } from 'node:fs';

const outFile = process.argv[2];
const count = Number(process.argv[3] || 4000);
const seed = Number(process.argv[4] || 8785);

// mulberry32: small, fast, deterministic
let state = seed >>> 0;
function rand() {
	state = (state + 0x6D2B79F5) >>> 0;
	let t = state;
	t = Math.imul(t ^ (t >>> 15), t | 1);
	t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
	return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
const pick = (a) => a[Math.floor(rand() * a.length)];
const chance = (p) => rand() < p;

// ---- numbers: every spelling is valid JSON text ---------------------------

const digitString = (n) => {
	let s = String(int(1, 9));
	for (let i = 1; i < n; i++) s += String(int(0, 9));
	return s;
};

// A double from 64 random bits (finite only)
const view = new DataView(new ArrayBuffer(8));
function randomDouble() {
	for (;;) {
		view.setUint32(0, Math.floor(rand() * 4294967296));
		view.setUint32(4, Math.floor(rand() * 4294967296));
		const d = view.getFloat64(0);
		if (Number.isFinite(d)) return d;
	}
}

// The exact decimal value of a finite double, or of the midpoint between it
// and the next double up (half = true), as JSON text with a small exponent
function exactDecimal(d, half) {
	view.setFloat64(0, Math.abs(d));
	const hi = view.getUint32(0);
	const lo = view.getUint32(4);
	const bexp = (hi >>> 20) & 0x7ff;
	let m = (BigInt(hi & 0xfffff) << 32n) | BigInt(lo);
	let e2 = bexp === 0 ? -1074 : bexp - 1075;
	if (bexp !== 0) m |= 1n << 52n;
	if (half) {
		m = 2n * m + 1n;
		e2 -= 1;
	}
	if (m === 0n) return d < 0 || Object.is(d, -0) ? '-0' : '0';
	let digits;
	let exp10;
	if (e2 >= 0) {
		digits = (m << BigInt(e2)).toString();
		exp10 = 0;
	} else {
		digits = (m * 5n ** BigInt(-e2)).toString();
		exp10 = e2;
	}
	// d.ddd...e(x): keeps the exponent within numeric's input limits
	const x = digits.length - 1 + exp10;
	const frac = digits.slice(1).replace(/0+$/, '');
	return (d < 0 ? '-' : '') + digits[0] + (frac ? '.' + frac : '') + 'e' + x;
}

// Respell a JSON number text without changing its value
function respell(text) {
	const mm = /^(-?)(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?$/.exec(text);
	if (!mm) throw new Error('bad number ' + text);
	const sign = mm[1];
	let digits = mm[2] + (mm[3] || '');
	let exp = Number(mm[4] || 0) - (mm[3] || '').length;
	digits = digits.replace(/^0+(?=\d)/, '');
	if (digits === '0' || /^0+$/.test(digits))
		return sign + '0' + pick(['', '.0', '.000', 'e5', 'E-3', '.0e+2']);
	let out;
	switch (int(0, 4)) {
		case 0:
			return text;
		case 1: { // trailing zeros
			const z = int(1, 3);
			out = sign + digits + '0'.repeat(z) + 'e' + (exp - z);
			break;
		}
		case 2: { // decimal point moved, capital E, explicit plus
			const shift = int(0, Math.min(digits.length, 30));
			const e = exp + shift;
			const intPart = digits.slice(0, digits.length - shift) || '0';
			const fracPart = digits.slice(digits.length - shift);
			out = sign + intPart + (fracPart ? '.' + fracPart : '') + 'E' + (e >= 0 ? '+' : '') + e;
			break;
		}
		case 3: // 0.000ddd form
			out = sign + '0.' + digits + 'e' + (exp + digits.length);
			break;
		default:
			out = sign + digits + 'e' + exp;
			break;
	}
	// PostgreSQL's numeric input takes exponents up to 1000 in magnitude
	const e = /e([+-]?\d+)$/i.exec(out);
	return e && Math.abs(Number(e[1])) > 1000 ? text : out;
}

let exponentCursor = -330;

function numberText() {
	let t;
	switch (int(0, 13)) {
		case 0: // small integers
			t = String(int(-1000, 100000));
			break;
		case 1: // money
			t = String(int(0, 999999)) + '.' + String(int(0, 99)).padStart(2, '0');
			break;
		case 2: { // every decimal exponent in turn, random digits
			const mant = digitString(int(1, 22));
			t = (chance(0.3) ? '-' : '') + mant[0] + '.' + mant.slice(1) + 'e' + exponentCursor;
			exponentCursor = exponentCursor >= 309 ? -330 : exponentCursor + 1;
			if (mant.length === 1) t = t.replace('.', '');
			break;
		}
		case 3: // integers near 2^53, 2^63, 2^64
			t = String(pick([2n ** 53n, 2n ** 63n, 2n ** 64n, 10n ** 21n, 10n ** 15n]) +
				BigInt(int(-5, 5)));
			if (chance(0.3)) t = '-' + t;
			break;
		case 4: // what JavaScript itself prints for a random double
			t = String(randomDouble());
			break;
		case 5: // the same with fewer or more digits than needed
			t = randomDouble().toPrecision(int(1, 21));
			break;
		case 6: // the exact decimal value of a random double
			t = exactDecimal(randomDouble(), false);
			break;
		case 7: // exactly halfway between two doubles: ties to even
			t = exactDecimal(randomDouble(), true);
			break;
		case 8: // doubles near the ends of the range and the subnormals
			t = exactDecimal(pick([5e-324, 1e-323, 2.2250738585072014e-308,
				2.225073858507201e-308, 1.7976931348623157e308, 1e308, 1e-310]) *
				(chance(0.5) ? -1 : 1), chance(0.3));
			break;
		case 9: // zeros and underflow
			t = pick(['0', '-0', '0.0', '-0.000', '0e5', '-0E-7', '1e-400', '-1e-400',
				'2.4703282292062327e-324', '2.4703282292062328e-324', '-3e-324']);
			break;
		case 10: // ECMAScript's notation boundaries
			t = pick(['1e21', '1e20', '999999999999999999999', '1e-6', '1e-7', '0.000001',
				'0.0000001', '123456789012345678901', '1.5e-7', '100', '4.50', '1E30',
				'1e23', '9.999999999999999e22', '333333333.33333329', '-0.0000033333333333333333',
				'1424953923781206.2', '295147905179352830000']);
			break;
		case 11: // powers of ten at every exponent
			t = (chance(0.5) ? '-' : '') + '1e' + int(-330, 308);
			break;
		case 12: // long decimals (more digits than a double holds)
			t = digitString(int(16, 60)) + 'e' + int(-360, 250);
			break;
		default: // short decimals
			t = (chance(0.2) ? '-' : '') + String(int(0, 9999)) + '.' + digitString(int(1, 6));
			break;
	}
	if (!Number.isFinite(Number(t))) return numberText();
	return chance(0.3) ? respell(t) : t;
}

// ---- strings ---------------------------------------------------------------

const specialChars = ['"', '\\', '/', '\b', '\t', '\n', '\f', '\r', '\u0001', '\u001f', '\u007f',
	'\u0080', '\u009f', '\u00a0', '\u00e9', 'e\u0301', '\u2028', '\u2029', '\u20ac', '\ufb33',
	'\ufeff', '\ufffd', '\uffff', '\ue000', '\u{1f600}', '\u{10000}', '\u{10ffff}', '\u{1d11e}'];

function randomChar() {
	switch (int(0, 9)) {
		case 0: case 1: case 2:
			return String.fromCharCode(int(0x20, 0x7e));
		case 3:
			return String.fromCharCode(int(1, 0x1f));
		case 4:
			return String.fromCharCode(int(0x80, 0xff));
		case 5:
			return String.fromCharCode(int(0x100, 0xd7ff));
		case 6:
			return String.fromCharCode(int(0xe000, 0xffff));
		case 7:
			return String.fromCodePoint(int(0x10000, 0x10ffff));
		default:
			return pick(specialChars);
	}
}

function randomString(maxLen) {
	let s = '';
	const n = int(0, maxLen);
	for (let i = 0; i < n; i++) s += randomChar();
	return s;
}

// JSON text for a string, escaped in random (valid) ways
function stringText(s) {
	let out = '"';
	for (const ch of s) {
		const cp = ch.codePointAt(0);
		const hex = (u) => '\\u' + (chance(0.5) ? u.toString(16) : u.toString(16).toUpperCase())
			.padStart(4, '0');
		if (ch === '"' || ch === '\\') out += '\\' + ch;
		else if (cp < 0x20) {
			const short = { 8: '\\b', 9: '\\t', 10: '\\n', 12: '\\f', 13: '\\r' }[cp];
			out += short && chance(0.5) ? short : hex(cp);
		} else if (ch === '/' && chance(0.5)) out += '\\/';
		else if (chance(0.15)) {
			if (cp > 0xffff) out += hex(ch.charCodeAt(0)) + hex(ch.charCodeAt(1));
			else out += hex(cp);
		} else out += ch;
	}
	return out + '"';
}

// Keys from a small alphabet so that prefixes, surrogate order and BMP
// characters above U+E000 meet often
const keyPieces = ['a', 'b', 'A', 'Z', '1', '10', '_', '\r', '\u0080', '\u00f6', '\u00e9',
	'e\u0301', '\u20ac', '\ufb33', '\uff61', '\ue000', '\uffff', '\u{1f600}', '\u{10000}',
	'\u{10ffff}', '\u2028', 'amount', 'currency', '"', '\\'];

function randomKey() {
	if (chance(0.2)) return randomString(6);
	let k = '';
	const n = int(0, 3);
	for (let i = 0; i < n; i++) k += pick(keyPieces);
	return k;
}

// ---- documents -----------------------------------------------------------

const ws = () => (chance(0.7) ? '' : pick([' ', '  ', '\n', '\t', '\r\n ', ' \n\t']));

function valueText(depth, width) {
	const r = rand();
	if (depth > 0 && r < 0.2) {
		const n = int(0, width);
		const items = [];
		for (let i = 0; i < n; i++) items.push(ws() + valueText(depth - 1, width) + ws());
		return '[' + items.join(',') + ws() + ']';
	}
	if (depth > 0 && r < 0.4) {
		const n = int(0, width);
		const seen = new Set();
		const members = [];
		for (let i = 0; i < n; i++) {
			const k = randomKey();
			if (seen.has(k) || k === '__proto__') continue;
			seen.add(k);
			members.push(ws() + stringText(k) + ws() + ':' + ws() + valueText(depth - 1, width) + ws());
		}
		return '{' + members.join(',') + ws() + '}';
	}
	if (r < 0.75) return numberText();
	if (r < 0.93) return stringText(randomString(12));
	return pick(['true', 'false', 'null']);
}

function documentText(id) {
	if (id % 997 === 500) {
		// a big one, to cross idem_hash's 64 kB flush boundary many times
		const items = [];
		for (let i = 0; i < 4000; i++) items.push(valueText(2, 6));
		return '{"big":[' + items.join(',') + '],"id":' + id + '}';
	}
	if (id % 10 === 0) return ws() + valueText(int(0, 2), 3) + ws(); // scalars and small
	// mostly objects, some wide enough for the qsort path (> 16 members)
	const width = id % 7 === 0 ? 40 : 8;
	const seen = new Set();
	const members = [];
	const n = int(1, width);
	for (let i = 0; i < n; i++) {
		const k = randomKey();
		if (seen.has(k) || k === '__proto__') continue;
		seen.add(k);
		members.push(ws() + stringText(k) + ws() + ':' + ws() + valueText(int(0, 4), 5));
	}
	return ws() + '{' + members.join(',') + '}' + ws();
}

// The reference: RFC 8785 for I-JSON
function canonical(v) {
	if (v === null || typeof v !== 'object') return JSON.stringify(v);
	if (Array.isArray(v)) return '[' + v.map(canonical).join(',') + ']';
	return '{' + Object.keys(v).sort()
		.map((k) => JSON.stringify(k) + ':' + canonical(v[k])).join(',') + '}';
}

const lines = [];
for (let id = 1; id <= count; id++) {
	const text = documentText(id);
	const canon = canonical(JSON.parse(text));
	const hash = createHash('sha256').update(canon, 'utf8').digest('hex');
	lines.push(id + '\t' + Buffer.from(text, 'utf8').toString('base64') + '\t' +
		Buffer.from(canon, 'utf8').toString('base64') + '\t' + hash);
}
writeFileSync(outFile, lines.join('\n') + '\n');
