// A small Markdown renderer for model output, which is untrusted: it builds DOM nodes and
// sets text through text nodes only, so nothing in the text is ever parsed as HTML.
// Covers what chat models write: fenced code blocks (also unclosed, while streaming),
// headings, bullet and numbered lists, block quotes, paragraphs, inline code, bold,
// italics and links (http, https and mailto only; anything else stays text).

const SAFE_URL = /^(https?:|mailto:)/i;
const INLINE =
  /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*\n]+)\*\*|(?<!\w)__([^_\n]+)__(?!\w)|\*([^*\s][^*\n]*)\*|\[([^\]\n]+)\]\(([^()\s]+)\)/g;

function el(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

/** Append `text` with its inline markup to `parent`, keeping line breaks. */
export function appendInline(parent, text) {
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    appendText(parent, text.slice(last, match.index));
    last = match.index + match[0].length;
    const [, ticks, code, bold, bold2, italic, label, url] = match;
    if (ticks) {
      const node = el("code");
      node.textContent = code;
      parent.append(node);
    } else if (bold || bold2) {
      const node = el("strong");
      appendInline(node, bold || bold2);
      parent.append(node);
    } else if (italic) {
      const node = el("em");
      appendInline(node, italic);
      parent.append(node);
    } else if (label && SAFE_URL.test(url)) {
      const node = el("a");
      node.href = url;
      node.rel = "noopener noreferrer nofollow";
      node.target = "_blank";
      node.textContent = label;
      parent.append(node);
    } else {
      appendText(parent, match[0]);
    }
  }
  appendText(parent, text.slice(last));
}

function appendText(parent, text) {
  const lines = text.split("\n");
  lines.forEach((line, i) => {
    if (i > 0) parent.append(el("br"));
    if (line) parent.append(document.createTextNode(line));
  });
}

/** `text` as a DocumentFragment of block elements. */
export function renderMarkdown(text) {
  const out = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let paragraph = [];
  let list = null;

  const flushParagraph = () => {
    if (paragraph.length) {
      const p = el("p");
      appendInline(p, paragraph.join("\n"));
      out.append(p);
      paragraph = [];
    }
  };
  const flushList = () => {
    list = null;
  };

  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+.#-]*)\s*$/);
    if (fence) {
      flushParagraph();
      flushList();
      const body = [];
      for (i++; i < lines.length && !lines[i].trim().startsWith(fence[1]); i++) body.push(lines[i]);
      const pre = el("pre");
      const code = el("code");
      if (fence[2]) {
        code.dataset.language = fence[2];
        pre.dataset.language = fence[2];
      }
      code.textContent = body.join("\n");
      pre.append(code);
      out.append(pre);
      continue;
    }
    if (!line.trim()) {
      flushParagraph();
      flushList();
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flushParagraph();
      flushList();
      const h = el(`h${Math.min(6, heading[1].length + 2)}`);
      appendInline(h, heading[2]);
      out.append(h);
      continue;
    }
    const item = line.match(/^\s*(?:([-*+])|(\d+)[.)])\s+(.*)$/);
    if (item) {
      flushParagraph();
      const tag = item[1] ? "ul" : "ol";
      if (!list || list.tagName.toLowerCase() !== tag) {
        list = el(tag);
        if (item[2] && item[2] !== "1") list.start = Number(item[2]);
        out.append(list);
      }
      const li = el("li");
      appendInline(li, item[3]);
      list.append(li);
      continue;
    }
    const quote = line.match(/^>\s?(.*)$/);
    if (quote) {
      flushParagraph();
      flushList();
      const block = el("blockquote");
      appendInline(block, quote[1]);
      out.append(block);
      continue;
    }
    flushList();
    paragraph.push(line);
  }
  flushParagraph();
  return out;
}
