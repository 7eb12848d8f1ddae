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
 */
#include "data/spm.h"
#include "fileio.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

namespace spp = sentencepiece;

struct Spm {
    spp::SentencePieceProcessor proc;
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
