/* spm.cc: the C API of spm.h over sentencepiece::SentencePieceProcessor and
 * SentencePieceTrainer; the only C++ in the project.
 *
 * No exception crosses into C: every entry point catches and reports a
 * sentence (or returns NULL / -1). Training options are fixed here so that
 * every model the project trains has the same special ids and behaviour:
 *   - unigram, pad 0 ("<pad>"), unk 1, bos 2, eos 3;
 *   - normalization_rule_name=identity (no NFKC) and, from 1024 pieces up,
 *     byte_fallback (a character outside the vocabulary becomes its UTF-8
 *     bytes, never <unk>): decode(encode(s)) == s for any valid UTF-8 line
 *     without leading, trailing or repeated spaces (those are folded);
 *     smaller test vocabularies cannot spare the 256 byte pieces;
 *   - character_coverage 0.9995 (Japanese has a long tail of kanji);
 *   - deterministic bytes: num_threads is a constant (EM sums per thread,
 *     so the thread count changes rounding), the random seed is fixed, and
 *     sentences come through an iterator and the model through a string,
 *     so no file name is recorded in the model;
 *   - minloglevel=1: the trainer's progress log is hidden, warnings shown.
 *
 * Sampling (spm_sample_ids) draws its own segmentations. SentencePiece's
 * SampleEncode takes its draws from a thread_local std::mt19937 seeded once,
 * at the thread's first draw, from the global SetRandomGeneratorSeed: a call
 * cannot be seeded, so a sample would depend on which thread drew what
 * before it, and a resume or another thread count could not replay it. So
 * the unigram lattice is rebuilt here from the model's pieces (a byte trie
 * of its normal pieces; a character no piece covers is an unknown node
 * scored min score - 10, SentencePiece's kUnkPenalty, spelled in byte
 * pieces under byte fallback) and sampled with forward filtering and
 * backward sampling (Kudo 2018; Lattice::Sample's algorithm) from a
 * SplitMix64 stream of the caller's seed. The n-best variant asks
 * SentencePiece for the n best (deterministic) and draws among them with
 * weights exp(alpha * score). test_spm_sample holds the lattice to
 * SentencePiece's own: at a large alpha every sample is Encode's best.
 */
#include "data/spm.h"
#include "data/splitmix.h"
#include "fileio.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace spp = sentencepiece;

/* The normal pieces as a byte trie, for the sampling lattice. */
struct PieceTrie {
    std::unordered_map<uint64_t, int32_t> child;  // node << 8 | byte -> node
    std::vector<int32_t> piece;                   // (nodes) the piece id ending at a node, or -1
    std::vector<float> score;                     // (vocab) each piece's log probability
    std::vector<int16_t> byte_value;              // (vocab) the byte a byte piece stands for, or -1
    std::vector<uint8_t> fixed;                   // (vocab) 1: a control, unknown or unused id (kept where it is)
    std::vector<std::string> text;                // (vocab) each piece's normalized text
    int32_t byte_id[256];                         // the byte piece of each byte, or -1 (no byte fallback)
    float unk_score = 0;
    bool byte_fallback = false;
};

struct Spm {
    spp::SentencePieceProcessor proc;
    PieceTrie trie;
};

static const int SPM_TRAIN_THREADS = 4;        // constant on purpose, see above
static const unsigned SPM_TRAIN_SEED = 20240601u;
static const int SPM_BYTE_FALLBACK_MIN_VOCAB = 1024;  // byte pieces take 256 ids

static void set_err(char *err, size_t err_len, const std::string &msg) {
    if (err && err_len > 0) std::snprintf(err, err_len, "%s", msg.c_str());
}

/* The training sentences, read line by line from the input files. Feeding
 * them through an iterator keeps the file names out of the model proto. */
class FileLines : public spp::SentenceIterator {
  public:
    FileLines(const char *const *paths, int n) : paths_(paths, paths + n) { advance(); }
    bool done() const override { return done_; }
    void Next() override { advance(); }
    const std::string &value() const override { return line_; }
    spp::util::Status status() const override { return status_; }

  private:
    void advance() {
        while (!done_) {
            if (in_.is_open() && std::getline(in_, line_)) {
                if (!line_.empty() && line_.back() == '\r') line_.pop_back();
                return;
            }
            if (in_.is_open()) {
                if (in_.bad()) return fail("read error in " + paths_[next_ - 1]);
                in_.close();
            }
            if (next_ == paths_.size()) {
                done_ = true;
                return;
            }
            in_.open(paths_[next_++], std::ios::binary);
            if (!in_) return fail("cannot open " + paths_[next_ - 1]);
        }
    }
    void fail(const std::string &msg) {
        status_ = spp::util::Status(spp::util::StatusCode::kNotFound, msg);
        done_ = true;
    }
    std::vector<std::string> paths_;
    size_t next_ = 0;
    std::ifstream in_;
    std::string line_;
    bool done_ = false;
    spp::util::Status status_;
};

/* Writes bytes to path through path.tmp.<pid> + fsync + rename: ranks
 * training the same tokenizer at once never share a temporary. */
static int write_atomic(const std::string &path, const std::string &bytes, char *err, size_t err_len) {
    AtomicFile f;
    if (atomic_file_open(&f, path.c_str(), true, err, err_len) != 0 ||
        atomic_file_write(&f, bytes.data(), bytes.size(), err, err_len) != 0)
        return -1;
    return atomic_file_commit(&f, err, err_len);
}

extern "C" int spm_train(const char *const *input_files, int n_files, const char *model_prefix, int vocab_size,
                         char *err, size_t err_len) {
    try {
        if (n_files < 1 || !input_files || !model_prefix) {
            set_err(err, err_len, "spm_train: no input files or no model prefix");
            return -1;
        }
        if (vocab_size < 8) {
            set_err(err, err_len, "spm_train: vocab_size must be >= 8, got " + std::to_string(vocab_size));
            return -1;
        }
        const std::unordered_map<std::string, std::string> kw = {
            {"model_type", "unigram"},
            {"vocab_size", std::to_string(vocab_size)},
            {"character_coverage", "0.9995"},
            {"normalization_rule_name", "identity"},
            {"pad_id", "0"},
            {"unk_id", "1"},
            {"bos_id", "2"},
            {"eos_id", "3"},
            {"pad_piece", "<pad>"},
            {"unk_piece", "<unk>"},
            {"bos_piece", "<s>"},
            {"eos_piece", "</s>"},
            {"byte_fallback", vocab_size >= SPM_BYTE_FALLBACK_MIN_VOCAB ? "true" : "false"},
            {"num_threads", std::to_string(SPM_TRAIN_THREADS)},
            {"minloglevel", "1"},
        };
        spp::SetRandomGeneratorSeed(SPM_TRAIN_SEED);
        FileLines lines(input_files, n_files);
        std::string model;
        const spp::util::Status st = spp::SentencePieceTrainer::Train(kw, &lines, &model);
        const std::string prefix(model_prefix);
        if (!st.ok()) {
            set_err(err, err_len, "SentencePiece training for " + prefix + ".model failed: " + st.ToString());
            return -1;
        }
        spp::SentencePieceProcessor proc;
        if (!proc.LoadFromSerializedProto(model).ok()) {
            set_err(err, err_len, "SentencePiece training for " + prefix + ".model produced an unreadable model");
            return -1;
        }
        std::string vocab;
        char score[32];
        for (int id = 0; id < proc.GetPieceSize(); id++) {
            std::snprintf(score, sizeof score, "\t%g\n", (double)proc.GetScore(id));
            vocab += proc.IdToPiece(id) + score;
        }
        if (write_atomic(prefix + ".model", model, err, err_len) != 0) return -1;
        return write_atomic(prefix + ".vocab", vocab, err, err_len);
    } catch (const std::exception &e) {
        set_err(err, err_len, std::string("SentencePiece training failed: ") + e.what());
    } catch (...) {
        set_err(err, err_len, "SentencePiece training failed with an unknown exception");
    }
    return -1;
}

static const float SPM_UNK_PENALTY = 10.0f;  // SentencePiece's kUnkPenalty: an unknown character's score below the least piece

/* The trie and the scores of s's model: normal pieces only (control,
 * unknown, unused and byte pieces are not in SentencePiece's lattice). */
static void trie_build(Spm *s) {
    PieceTrie &t = s->trie;
    const int vocab = s->proc.GetPieceSize();
    t.piece.assign(1, -1);
    t.score.resize((size_t)vocab);
    t.byte_value.assign((size_t)vocab, -1);
    t.fixed.assign((size_t)vocab, 0);
    t.text.resize((size_t)vocab);
    for (int b = 0; b < 256; b++) t.byte_id[b] = -1;
    float min_score = FLT_MAX;
    for (int id = 0; id < vocab; id++) {
        t.score[(size_t)id] = s->proc.GetScore(id);
        if (s->proc.IsByte(id)) {
            const std::string p = s->proc.IdToPiece(id);  // "<0xAB>"
            const unsigned v = (unsigned)std::strtoul(p.c_str() + 3, nullptr, 16);
            if (p.size() == 6 && v < 256) t.byte_id[v] = id, t.byte_value[(size_t)id] = (int16_t)v;
            continue;
        }
        if (s->proc.IsControl(id) || s->proc.IsUnknown(id) || s->proc.IsUnused(id)) {
            t.fixed[(size_t)id] = 1;
            continue;
        }
        if (t.score[(size_t)id] < min_score) min_score = t.score[(size_t)id];
        t.text[(size_t)id] = s->proc.IdToPiece(id);
        int32_t node = 0;
        for (unsigned char c : t.text[(size_t)id]) {
            const uint64_t key = (uint64_t)node << 8 | c;
            auto it = t.child.find(key);
            if (it == t.child.end()) {
                it = t.child.emplace(key, (int32_t)t.piece.size()).first;
                t.piece.push_back(-1);
            }
            node = it->second;
        }
        t.piece[(size_t)node] = id;
    }
    t.unk_score = (min_score == FLT_MAX ? 0.0f : min_score) - SPM_UNK_PENALTY;
    t.byte_fallback = true;
    for (int b = 0; b < 256; b++) t.byte_fallback &= t.byte_id[b] >= 0;
}

extern "C" Spm *spm_load(const char *model_path, char *err, size_t err_len) {
    Spm *s = nullptr;
    try {
        /* Through the project's reader: a named pipe in place of the model is
         * refused instead of waited on. */
        size_t n_bytes = 0;
        char why[1024];
        char *bytes = static_cast<char *>(read_file_bytes(model_path, &n_bytes, why, sizeof why));
        if (!bytes) {
            set_err(err, err_len, std::string("cannot load SentencePiece model: ") + why);
            return nullptr;
        }
        const std::string proto(bytes, n_bytes);
        std::free(bytes);
        s = new Spm();
        const spp::util::Status st = s->proc.LoadFromSerializedProto(proto);
        if (!st.ok()) {
            set_err(err, err_len, std::string("cannot load SentencePiece model ") + model_path + ": " + st.ToString());
            delete s;
            return nullptr;
        }
        if (s->proc.pad_id() != SPM_PAD_ID || s->proc.unk_id() != SPM_UNK_ID || s->proc.bos_id() != SPM_BOS_ID ||
            s->proc.eos_id() != SPM_EOS_ID) {
            set_err(err, err_len,
                    std::string("SentencePiece model ") + model_path + " has special ids pad/unk/bos/eos = " +
                        std::to_string(s->proc.pad_id()) + "/" + std::to_string(s->proc.unk_id()) + "/" +
                        std::to_string(s->proc.bos_id()) + "/" + std::to_string(s->proc.eos_id()) +
                        ", expected 0/1/2/3");
            delete s;
            return nullptr;
        }
        trie_build(s);
        return s;
    } catch (const std::exception &e) {
        set_err(err, err_len, std::string("cannot load SentencePiece model ") + model_path + ": " + e.what());
    } catch (...) {
        set_err(err, err_len, std::string("cannot load SentencePiece model ") + model_path);
    }
    delete s;
    return nullptr;
}

extern "C" void spm_free(Spm *s) { delete s; }

extern "C" int spm_vocab_size(const Spm *s) {
    try {
        return s ? s->proc.GetPieceSize() : 0;
    } catch (...) {
        return 0;
    }
}

extern "C" int spm_encode(const Spm *s, const char *text, int32_t *ids, int cap) {
    if (!s || !text || cap < 0) return -1;
    try {
        std::vector<int> out;
        if (!s->proc.Encode(text, &out).ok()) return -1;
        const int n = (int)out.size();
        const int n_copy = n < cap ? n : cap;
        for (int i = 0; i < n_copy; i++) ids[i] = out[i];
        return n;
    } catch (...) {
        return -1;
    }
}

/* ---- sampling ---------------------------------------------------------------- */

namespace {

struct Node {
    int32_t begin, end, id;  // bytes [begin, end) of the text; id < 0: an unknown character
    float score;
};

/* A sampler's scratch, kept per thread across calls. */
struct Scratch {
    std::vector<Node> nodes;
    std::vector<double> fw;        // (L + 1) log of the summed weight of the segmentations of text[0, pos)
    std::vector<int32_t> end_at;   // (L + 2) nodes ending at pos: by_end[end_at[pos] .. end_at[pos + 1])
    std::vector<int32_t> by_end;
    std::vector<int32_t> picked, fill;
    std::string text;
};

double uniform01(uint64_t *rng) { return (double)(splitmix64(rng) >> 11) * (1.0 / 9007199254740992.0); }

double log_add(double a, double b) {
    if (a == -INFINITY) return b;
    if (b == -INFINITY) return a;
    return a > b ? a + std::log1p(std::exp(b - a)) : b + std::log1p(std::exp(a - b));
}

int utf8_len(unsigned char c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/* The lattice of text: every normal piece at every character, and an
 * unknown node where no one-character piece starts. */
void lattice_build(const PieceTrie &t, const std::string &text, std::vector<Node> *nodes) {
    const int L = (int)text.size();
    nodes->clear();
    for (int i = 0; i < L;) {
        const int clen = std::min(utf8_len((unsigned char)text[(size_t)i]), L - i);
        bool single = false;
        int32_t node = 0;
        for (int j = i; j < L; j++) {
            auto it = t.child.find((uint64_t)node << 8 | (unsigned char)text[(size_t)j]);
            if (it == t.child.end()) break;
            node = it->second;
            const int32_t id = t.piece[(size_t)node];
            const bool boundary = j + 1 == L || ((unsigned char)text[(size_t)j + 1] & 0xC0) != 0x80;
            if (id < 0 || !boundary) continue;
            nodes->push_back(Node{i, j + 1, id, t.score[(size_t)id]});
            single |= j + 1 == i + clen;
        }
        if (!single) nodes->push_back(Node{i, i + clen, -1, t.unk_score});
        i += clen;
    }
}

/* One segmentation of the normalized text, drawn with weight
 * exp(alpha * score) by forward filtering and backward sampling; its ids
 * appended to out. */
void lattice_sample(const PieceTrie &t, Scratch &w, float alpha, uint64_t *rng, std::vector<int> *out) {
    const std::string &text = w.text;
    const int L = (int)text.size();
    if (L == 0) return;
    lattice_build(t, text, &w.nodes);
    w.fw.assign((size_t)L + 1, -INFINITY);
    w.fw[0] = 0.0;
    w.end_at.assign((size_t)L + 2, 0);
    for (const Node &n : w.nodes) {  // in order of their beginnings: fw[begin] is final when read
        w.fw[(size_t)n.end] = log_add(w.fw[(size_t)n.end], w.fw[(size_t)n.begin] + (double)alpha * n.score);
        w.end_at[(size_t)n.end + 1]++;
    }
    for (int p = 0; p <= L; p++) w.end_at[(size_t)p + 1] += w.end_at[(size_t)p];
    w.by_end.resize(w.nodes.size());
    w.fill.assign(w.end_at.begin(), w.end_at.end() - 1);
    for (int32_t k = 0; k < (int32_t)w.nodes.size(); k++) w.by_end[(size_t)w.fill[(size_t)w.nodes[(size_t)k].end]++] = k;
    w.picked.clear();
    for (int pos = L; pos > 0;) {
        const int32_t a = w.end_at[(size_t)pos], b = w.end_at[(size_t)pos + 1];
        double total = 0.0;
        for (int32_t k = a; k < b; k++) {
            const Node &n = w.nodes[(size_t)w.by_end[(size_t)k]];
            total += std::exp(w.fw[(size_t)n.begin] + (double)alpha * n.score - w.fw[(size_t)pos]);
        }
        double u = uniform01(rng) * total;
        int32_t pick = w.by_end[(size_t)b - 1];
        for (int32_t k = a; k < b; k++) {
            const Node &n = w.nodes[(size_t)w.by_end[(size_t)k]];
            u -= std::exp(w.fw[(size_t)n.begin] + (double)alpha * n.score - w.fw[(size_t)pos]);
            if (u < 0.0) {
                pick = w.by_end[(size_t)k];
                break;
            }
        }
        w.picked.push_back(pick);
        pos = w.nodes[(size_t)pick].begin;
    }
    for (size_t k = w.picked.size(); k-- > 0;) {
        const Node &n = w.nodes[(size_t)w.picked[k]];
        if (n.id >= 0) out->push_back(n.id);
        else if (!t.byte_fallback) out->push_back(SPM_UNK_ID);
        else
            for (int32_t i = n.begin; i < n.end; i++) out->push_back(t.byte_id[(unsigned char)text[(size_t)i]]);
    }
}

/* One of SentencePiece's nbest best segmentations of the sentence, drawn
 * with weight exp(alpha * score); the best when it holds a fixed id (its
 * text would not spell the sentence). */
int nbest_sample(const Spm *s, const int32_t *best, int n_best, int nbest, float alpha, uint64_t *rng,
                 std::vector<int> *out) {
    const std::vector<int> ids(best, best + n_best);
    for (int id : ids)
        if (s->trie.fixed[(size_t)id]) return *out = ids, 0;
    std::string sentence;
    if (!s->proc.Decode(ids, &sentence).ok()) return -1;
    const spp::ImmutableNBestSentencePieceText nb = s->proc.NBestEncodeAsImmutableProto(sentence, nbest);
    const int n = (int)nb.nbests_size();
    if (n == 0) return *out = ids, 0;
    double top = -INFINITY, total = 0.0;
    for (int k = 0; k < n; k++) top = std::max(top, (double)nb.nbests(k).score());
    std::vector<double> weight((size_t)n);
    for (int k = 0; k < n; k++) total += weight[(size_t)k] = std::exp((double)alpha * (nb.nbests(k).score() - top));
    double u = uniform01(rng) * total;
    int pick = n - 1;
    for (int k = 0; k < n; k++)
        if ((u -= weight[(size_t)k]) < 0.0) {
            pick = k;
            break;
        }
    out->clear();
    for (const auto &p : nb.nbests(pick).pieces()) out->push_back((int)p.id());
    return 0;
}

}  // namespace

extern "C" int spm_sample_ids(const Spm *s, const int32_t *best, int n_best, int nbest, float alpha, uint64_t seed,
                              int32_t *ids, int cap) {
    if (!s || n_best < 0 || (n_best > 0 && !best) || cap < 0 || (cap > 0 && !ids) || nbest == 0 || nbest == 1 ||
        !(alpha >= 0.0f))
        return -1;
    try {
        const PieceTrie &t = s->trie;
        const int vocab = (int)t.score.size();
        for (int i = 0; i < n_best; i++)
            if (best[i] < 0 || best[i] >= vocab) return -1;
        thread_local Scratch w;
        thread_local std::vector<int> out;
        out.clear();
        uint64_t rng = seed;
        if (nbest > 1) {
            if (nbest_sample(s, best, n_best, nbest, alpha, &rng, &out) != 0) return -1;
        } else {
            w.text.clear();
            for (int i = 0; i < n_best; i++) {
                const int id = best[i];
                if (t.byte_value[(size_t)id] >= 0) {
                    w.text.push_back((char)t.byte_value[(size_t)id]);
                } else if (t.fixed[(size_t)id]) {  // kept in place: the text on each side is sampled alone
                    lattice_sample(t, w, alpha, &rng, &out);
                    w.text.clear();
                    out.push_back(id);
                } else {
                    w.text += t.text[(size_t)id];
                }
            }
            lattice_sample(t, w, alpha, &rng, &out);
        }
        const int n = (int)out.size();
        for (int i = 0; i < n && i < cap; i++) ids[i] = out[(size_t)i];
        return n;
    } catch (...) {
        return -1;
    }
}

extern "C" char *spm_decode(const Spm *s, const int32_t *ids, int n) {
    if (!s || n < 0 || (n > 0 && !ids)) return nullptr;
    try {
        const int vocab = s->proc.GetPieceSize();
        std::vector<int> kept;
        kept.reserve((size_t)n);
        for (int i = 0; i < n; i++) {
            const int id = ids[i];
            if (id == SPM_PAD_ID || id == SPM_BOS_ID || id == SPM_EOS_ID) continue;
            if (id < 0 || id >= vocab) return nullptr;
            kept.push_back(id);
        }
        std::string text;
        if (!s->proc.Decode(kept, &text).ok()) return nullptr;
        char *out = (char *)std::malloc(text.size() + 1);
        if (!out) return nullptr;
        std::memcpy(out, text.data(), text.size());
        out[text.size()] = '\0';
        return out;
    } catch (...) {
        return nullptr;
    }
}

extern "C" const char *spm_id_to_piece(const Spm *s, int32_t id, char *buf, size_t buf_len) {
    if (!buf || buf_len == 0) return "";
    buf[0] = '\0';
    try {
        if (s && id >= 0 && id < s->proc.GetPieceSize()) std::snprintf(buf, buf_len, "%s", s->proc.IdToPiece(id).c_str());
    } catch (...) {
        buf[0] = '\0';
    }
    return buf;
}
