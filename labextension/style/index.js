import 'katex/dist/katex.min.css';
import './base.css';
